"""Chunk-level incremental embedding: what editing one section of a long document costs.

The sample knowledge base's 12-part operations handbook is ingested alone; then one sentence
is added to one part and it is ingested again. The edit's embedding work is compared with the
first ingest's: chunks embedded, model tokens embedded, and seconds spent in the embedder.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from server.config.loading import load_settings
from server.container import chunking_rule, open_runtime

ROOT = Path(__file__).resolve().parent.parent
HANDBOOK = ROOT / "examples" / "knowledge" / "onboarding" / "operations-handbook.md"
EDITED_PART = "## Part 6"
ADDED = " Renewals above $10,000 a year also need the finance partner's sign-off."


class _Counting:
    """Wraps the runtime's embedder: seconds and tokens of the passages it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.tokens = 0

    def embed_passages_with_lexical(self, texts: Sequence[str]) -> Any:
        return self._counted(self.inner.embed_passages_with_lexical, texts)

    def embed_passages(self, texts: Sequence[str]) -> Any:
        # Not called by the Ingestor, which takes the lexical path above; the Ingestor's type needs it.
        return self._counted(self.inner.embed_passages, texts)

    def _counted(self, embed: Callable[[Sequence[str]], Any], texts: Sequence[str]) -> Any:
        self.tokens += sum(self.inner.count_tokens(t) for t in texts)
        started = time.perf_counter()
        try:
            return embed(texts)
        finally:
            self.seconds += time.perf_counter() - started


def _edit(text: str) -> str:
    head, marker, tail = text.partition(EDITED_PART)
    if not marker:
        raise RuntimeError(f"{HANDBOOK} has no {EDITED_PART!r} section to edit")
    title_line, _, rest = tail.partition("\n\n")
    paragraph, _, after = rest.partition("\n\n")
    return f"{head}{marker}{title_line}\n\n{paragraph}{ADDED}\n\n{after}"


def measure(work: Path, embedder: Any) -> dict[str, Any]:
    """Embedding work of the first ingest of the handbook and of a one-section edit."""
    from retrieval.ingest import Ingestor

    kb, data = work / "incremental-kb", work / "incremental-data"
    shutil.rmtree(kb, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    target = kb / "onboarding" / HANDBOOK.name
    target.parent.mkdir(parents=True)
    original = HANDBOOK.read_text(encoding="utf-8")
    target.write_text(original, encoding="utf-8")
    settings = load_settings(None, data_dir=data)
    runtime = open_runtime(settings, embedder=embedder)
    rows = {}
    try:
        for step in ("first ingest", "one part edited"):
            if step == "one part edited":
                target.write_text(_edit(original), encoding="utf-8")
            counting = _Counting(runtime.embedder)
            ingestor = Ingestor(
                runtime.catalog,
                runtime.store,
                counting,
                rule=chunking_rule(settings, runtime.embedder),
                batch_size=settings.embedder.batch_size,
            )
            report = ingestor.run(kb)
            rows[step] = {
                "chunks": report.chunks,
                "embedded": report.embedded,
                "tokens_embedded": counting.tokens,
                "embed_s": round(counting.seconds, 2),
                "ingest_s": round(report.seconds, 2),
            }
    finally:
        runtime.close()
        shutil.rmtree(kb, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    first, edit = rows["first ingest"], rows["one part edited"]
    return {
        "document": str(HANDBOOK.relative_to(ROOT)),
        "steps": rows,
        "embedded_share": round(edit["embedded"] / first["embedded"], 3),
        "token_share": round(edit["tokens_embedded"] / first["tokens_embedded"], 3),
        "embed_seconds_share": round(edit["embed_s"] / first["embed_s"], 3) if first["embed_s"] else None,
    }
