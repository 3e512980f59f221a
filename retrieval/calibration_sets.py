"""Evaluation sets: labelled question files, and the knowledge bases they are asked of.

A question file has one JSON object per line: ``{"query": ..., "doc": doc_key | null, "kind": ...,
"answer": ...}``. ``kind`` is code, paraphrase, cross, long, offtopic or near (offtopic and near
have no doc); ``answer`` is a short passage of the document that answers the question.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from retrieval.engine import Evidence, KnowledgeView
from storage.catalog_records import ChunkRecord

KINDS = ("code", "paraphrase", "cross", "long", "offtopic", "near")


class CalibrationError(ValueError):
    """The question file is malformed; the message names the line."""


@dataclass(frozen=True)
class LabelledQuery:
    query: str
    doc: str | None
    kind: str = "paraphrase"
    answer: str | None = None

    @property
    def answerable(self) -> bool:
        return self.doc is not None


def read_queries(path: Path) -> list[LabelledQuery]:
    """Parse a question file, naming the line of any problem."""
    queries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{path}:{number}: not JSON: {exc.msg}") from exc
        if not isinstance(item, dict) or not isinstance(item.get("query"), str) or not item["query"].strip():
            raise CalibrationError(f"{path}:{number}: needs a non-empty string 'query'")
        doc = item.get("doc")
        if doc is not None and not isinstance(doc, str):
            raise CalibrationError(f"{path}:{number}: 'doc' must be a doc_key string or null")
        kind = item.get("kind") or ("paraphrase" if doc else "offtopic")
        if kind not in KINDS:
            raise CalibrationError(f"{path}:{number}: 'kind' must be one of {', '.join(KINDS)}")
        queries.append(LabelledQuery(item["query"], doc, kind, item.get("answer")))
    if not queries:
        raise CalibrationError(f"{path}: no queries")
    return queries


# Compared by identity: calibration memoises what it computes per knowledge base.
@dataclass(frozen=True, eq=False)
class KnowledgeBase:
    """One ingested knowledge base with its questions and their evidence."""

    name: str
    view: KnowledgeView
    chunks: Mapping[str, list[ChunkRecord]]
    queries: Sequence[LabelledQuery]
    evidence: Sequence[Evidence]
    # The background questions (retrieval.background) asked of this knowledge base: negatives.
    background: Sequence[Evidence] = ()

    def chunks_of(self, doc_key: str) -> list[ChunkRecord]:
        return list(self.chunks.get(doc_key, []))
