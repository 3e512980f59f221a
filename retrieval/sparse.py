"""BGE-M3's lexical (sparse) matching, scored in Python over a query's candidate chunks.

BGE-M3 gives every token of a text a weight in the same forward pass as its dense vector.
The lexical score of a passage is the dot product of the two weight maps over their shared
tokens. It is computed here rather than in Milvus so that it works on Milvus Lite and on a
Milvus 2.3 server alike (neither has to hold a sparse field): the candidates are already
known from the dense and FTS searches, and scoring a few dozen small maps costs microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Token id (as a string, FlagEmbedding's own key) -> weight.
LexicalWeights = Mapping[str, float]


def lexical_match(query: LexicalWeights, passage: LexicalWeights) -> float:
    """The dot product over shared tokens, divided by the query's self-score.

    Raw scores grow with the query's length and wording; divided by what the query scores
    against itself, a passage repeating the query's tokens with the query's weights scores
    1.0, so one fusion weight means the same for every query.
    """
    own = sum(w * w for w in query.values())
    if own <= 0.0:
        return 0.0
    return sum(w * passage.get(token, 0.0) for token, w in query.items()) / own


def match_scores(
    query: LexicalWeights, passages: Mapping[str, LexicalWeights], chunk_ids: Iterable[str]
) -> dict[str, float]:
    """chunk_id -> lexical match of each candidate; a chunk without stored weights scores 0."""
    return {cid: lexical_match(query, passages.get(cid, {})) for cid in chunk_ids}
