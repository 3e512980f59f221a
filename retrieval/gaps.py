"""Which logged questions the knowledge base could not answer, grouped by meaning.

Plain functions over the log's rows and the questions' vectors (the configured embedder's, unit
length): the caller embeds, this module decides and groups. A question counts when
- its lookup was NO_MATCH;
- its lookup was REFERENCE and a later lookup of the same session was on the same topic:
  targeted (``missing_dimension``), a rephrasing (its vector within ``similarity`` of this one,
  or the same text or hash) or DEDUPED because the session held those documents or that domain;
- its session then read more of a document the lookup delivered (the part delivered was not
  enough);
- it rephrases, in the same session, a question that counts for one of the reasons above and
  was not answered either (DEDUPED, say: the session already held the unhelpful document).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from retrieval.models import Tier
from storage.log_reads import LookupRow, ReadRow

GapReason = Literal["no_match", "reference_followed", "read_further", "rephrasing"]
# Cosine of two query vectors (e5-small's, language-centred) from which two questions are taken
# as one question in other words: rephrasings of one question measured 0.63-0.87 (Chinese and
# English wordings of one question 0.63), different questions of one domain 0.24-0.56.
DEFAULT_SIMILARITY = 0.6
# How many of a session's next lookups may be a rephrasing or a follow-up of a question: the
# vectors needed stay proportional to the unanswered questions, not to the sessions' length.
FOLLOW_WINDOW = 3
# Tiers that answered: a later lookup answered so is not a rephrasing of an unanswered question.
_ANSWERED = (Tier.PRECISE, Tier.HIGHLY_RELEVANT)
EXAMPLES = 3


@dataclass(frozen=True)
class GapQuestion:
    """One question the knowledge base could not answer, and why it counts."""

    row: LookupRow
    reason: GapReason


@dataclass(frozen=True)
class GapGroup:
    """Questions of one meaning: how many, from how many sessions, when, and its centre."""

    questions: tuple[GapQuestion, ...]
    centroid: np.ndarray

    @property
    def sessions(self) -> int:
        # A row without a session key is a session of its own (the CLI's lookups, say).
        return len({q.row.session_key or f"row:{q.row.id}" for q in self.questions})

    @property
    def first_seen(self) -> float:
        return min(q.row.ts for q in self.questions)

    @property
    def last_seen(self) -> float:
        return max(q.row.ts for q in self.questions)

    def examples(self, count: int = EXAMPLES) -> list[str]:
        """The most asked distinct wordings, first asked first among equals."""
        counts = Counter(q.row.query for q in self.questions if q.row.query)
        return [text for text, _ in counts.most_common(count)]

    def reasons(self) -> dict[str, int]:
        return dict(Counter(q.reason for q in self.questions))

    def tiers(self) -> dict[str, int]:
        return dict(Counter(q.row.relevance_level or "" for q in self.questions))


def by_session(lookups: Sequence[LookupRow]) -> dict[str, list[LookupRow]]:
    """The lookups of each session, in log order (rows without a session are left out)."""
    sessions: dict[str, list[LookupRow]] = defaultdict(list)
    for row in lookups:
        if row.session_key is not None:
            sessions[row.session_key].append(row)
    return sessions


def texts_to_embed(lookups: Sequence[LookupRow], reads: Sequence[ReadRow]) -> list[str]:
    """The distinct question texts the selection and the grouping need vectors for."""
    needed: dict[str, None] = {}
    followers = {row.id for rows in by_session(lookups).values() for row in _after_reference(rows)}
    wanted = followers | _read_further(lookups, reads)
    for row in lookups:
        if row.hashed or row.query is None:
            continue
        if row.relevance_level in (Tier.NO_MATCH, Tier.REFERENCE) or row.id in wanted:
            needed.setdefault(row.query)
    return list(needed)


def _after_reference(rows: Sequence[LookupRow]) -> list[LookupRow]:
    """The lookups within FOLLOW_WINDOW after a NO_MATCH or REFERENCE: candidates to be rephrasings."""
    later: dict[int, LookupRow] = {}
    for i, row in enumerate(rows):
        if row.relevance_level in (Tier.NO_MATCH, Tier.REFERENCE):
            later.update((other.id, other) for other in rows[i + 1 : i + 1 + FOLLOW_WINDOW])
    return list(later.values())


# Why a later lookup was DEDUPED when it hit what the session already held: the same topic.
_SAME_TOPIC = ("doc_retrieved", "domain_retrieved")


def _similar(a: LookupRow, b: LookupRow, vectors: Mapping[str, np.ndarray], similarity: float) -> bool:
    """The same question: the same text (or hash, when queries are not logged) or near vectors."""
    if a.query is not None and a.query == b.query:
        return True
    mine, theirs = vectors.get(a.query or ""), vectors.get(b.query or "")
    return mine is not None and theirs is not None and float(mine @ theirs) >= similarity


def _followed(
    row: LookupRow, later: Sequence[LookupRow], vectors: Mapping[str, np.ndarray], similarity: float
) -> bool:
    """A later lookup of the session was targeted, or asked the same thing in other words."""
    return any(
        other.missing_dimension
        or other.dedup_reason in _SAME_TOPIC
        or _similar(row, other, vectors, similarity)
        for other in later
    )


def _read_further(lookups: Sequence[LookupRow], reads: Sequence[ReadRow]) -> set[int]:
    """Ids of the lookups whose session then read more of a document they delivered."""
    found: set[int] = set()
    sessions = by_session(lookups)
    for read in reads:
        if read.session_key is None:
            continue
        earlier = [row for row in sessions.get(read.session_key, []) if row.ts <= read.ts]
        for doc_key in read.doc_keys:
            last = next((row for row in reversed(earlier) if doc_key in row.doc_keys), None)
            if last is not None:
                found.add(last.id)
    return found


def _reason(
    row: LookupRow,
    session: Sequence[LookupRow],
    read_further: set[int],
    vectors: Mapping[str, np.ndarray],
    similarity: float,
) -> GapReason | None:
    if row.relevance_level == Tier.NO_MATCH:
        return "no_match"
    if row.relevance_level == Tier.REFERENCE:
        # Only a REFERENCE needs the rest of its session: the scan stays linear in the log.
        later = [other for other in session if other.id > row.id][:FOLLOW_WINDOW]
        if _followed(row, later, vectors, similarity):
            return "reference_followed"
    if row.id in read_further:
        return "read_further"
    return None


def select_gaps(
    lookups: Sequence[LookupRow],
    reads: Sequence[ReadRow],
    vectors: Mapping[str, np.ndarray],
    *,
    similarity: float = DEFAULT_SIMILARITY,
) -> list[GapQuestion]:
    """The questions that count (module docstring), in log order; hashed queries included."""
    read_further = _read_further(lookups, reads)
    sessions = by_session(lookups)
    gaps: list[GapQuestion] = []
    session_gaps: dict[str, list[LookupRow]] = defaultdict(list)
    for row in lookups:
        session = sessions.get(row.session_key, []) if row.session_key is not None else []
        reason = _reason(row, session, read_further, vectors, similarity)
        if reason is None and row.relevance_level not in _ANSWERED and row.session_key is not None:
            earlier = session_gaps.get(row.session_key, [])
            if any(_similar(row, other, vectors, similarity) for other in earlier):
                reason = "rephrasing"
        if reason is not None:
            gaps.append(GapQuestion(row, reason))
            if row.session_key is not None:
                session_gaps[row.session_key].append(row)
    return gaps


def group_gaps(
    questions: Sequence[GapQuestion],
    vectors: Mapping[str, np.ndarray],
    *,
    similarity: float = DEFAULT_SIMILARITY,
) -> list[GapGroup]:
    """Questions with text grouped by meaning, most sessions first.

    Each distinct wording, in the order first asked, joins the group whose centre is nearest
    when within ``similarity``, else starts one; a centre is the mean of its wordings weighted
    by how often each was asked. Identical wordings share a vector, so they always share a group.
    """
    wordings: dict[str, list[GapQuestion]] = {}
    for question in questions:
        text = question.row.query
        if text is not None and not question.row.hashed and text in vectors:
            wordings.setdefault(text, []).append(question)
    if not wordings:
        return []
    dim = len(next(iter(vectors.values())))
    sums = np.zeros((len(wordings), dim), dtype=np.float32)
    centres = np.zeros_like(sums)
    members: list[list[GapQuestion]] = []
    for text, asked in wordings.items():
        vector = vectors[text]
        count = len(members)
        scores = centres[:count] @ vector if count else np.empty(0)
        index = int(np.argmax(scores)) if count else -1
        if index < 0 or float(scores[index]) < similarity:
            index = count
            members.append([])
        members[index].extend(asked)
        sums[index] += len(asked) * vector
        centres[index] = sums[index] / max(float(np.linalg.norm(sums[index])), 1e-12)
    groups = [
        GapGroup(tuple(sorted(qs, key=lambda q: q.row.id)), centres[i].copy()) for i, qs in enumerate(members)
    ]
    return sorted(groups, key=lambda g: (-g.sessions, -len(g.questions), g.first_seen))


def counts_by_domain(questions: Sequence[GapQuestion]) -> dict[str, int]:
    """Questions per domain filter ("(any)" without one): all a hashed log can say."""
    return dict(Counter(q.row.domain or "(any)" for q in questions).most_common())
