"""Write the default embedder's background vectors into the package (retrieval/background_vectors/).

Run it after editing retrieval/background_questions.jsonl: a server then reads them instead of
encoding 1,635 questions (about 30 s) for every new data directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval.background import (
    SHIPPED_DIR,
    encode_background,
    load_questions,
    questions_digest,
    shipped_name,
)
from retrieval.embedders import create_embedder


def main() -> None:
    embedder = create_embedder("e5-small")
    questions = load_questions()
    digest = questions_digest(questions)
    target = Path(__file__).parents[1] / "retrieval" / SHIPPED_DIR
    target.mkdir(exist_ok=True)
    for old in target.glob(f"{embedder.name}-*.npy"):
        old.unlink()
    background = encode_background(embedder, None, questions)
    np.save(target / shipped_name(embedder.name, digest), background.vectors)
    print(f"wrote {len(questions)} vectors to {target / shipped_name(embedder.name, digest)}")


if __name__ == "__main__":
    main()
