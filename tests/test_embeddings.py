"""The MiniLM sentence encoder gives a text one vector, whatever it is embedded with and whatever came before: a
dataset rebuilt in another process (a resumed phase-1 run) must equal the first build bit for bit, or the learners
trained on it differ and the test ledger rightly refuses their second evaluation."""

from __future__ import annotations

import numpy as np

from envs.embeddings import MiniLMEmbedder

TEXTS = [
    "Tom has 4 apples. He buys 6 more. How many apples does Tom have now?",
    "A box holds 12 pens. Anna fills 3 boxes and then gives away 5 pens. How many pens does she have?",
    "print(12 * 3 - 5)",
    "[python] 31",
    "Omar packs 6 boxes with 8 shells each. He gives away 11 shells. How many shells does he have left? " * 3,
    "24 cookies are shared equally by 4 children.",
    # nine replies of one token length: batched together (no padding) their vectors still moved with the batch
    *(f"print({n})" for n in (11, 13, 15, 16, 18, 20, 22, 36, 45)),
]


def test_a_texts_vector_does_not_depend_on_its_batch_or_on_what_came_before() -> None:
    alone = np.stack([MiniLMEmbedder().embed([t])[0] for t in TEXTS])  # a fresh memo per text
    together = MiniLMEmbedder().embed(TEXTS)  # one call: every length at once
    shuffled = MiniLMEmbedder()
    shuffled.embed(TEXTS[3:])  # another history in the memo
    after = shuffled.embed(TEXTS[::-1])[::-1]
    assert np.array_equal(alone, together) and np.array_equal(alone, after)
    assert np.allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-5)
    assert not np.array_equal(alone[0], alone[1])  # the vectors are the texts', not one constant
    assert not MiniLMEmbedder().embed(["", TEXTS[0]])[0].any()  # an empty text: zeros
