"""elmo_tf/serving/signature.py: input roles come from the SignatureDef's shapes, not its names (and the request
budget uses them)."""

import numpy as np
from serving_fake import INVALID, budget_error, sentences_budget, tokens_budget

from elmo_tf.serving.limits.budget import Limits


def test_input_roles_come_from_the_signature_def():
    """Other names, same shapes: the padded input, its lengths and sentences are found by shape."""
    budget = tokens_budget(Limits(max_request_tokens=20), tokens="words", lengths="n")
    assert (budget.signature.padded_input, budget.signature.lengths_input, budget.signature.sentence_inputs) == (
        "words",
        "n",
        (),
    )
    assert budget.signature.lengths_output == "sequence_len"
    details = budget_error(
        lambda: budget.prepare({"words": np.full((2, 3), b"w", object), "n": np.array([1, 4], np.int32)}), INVALID
    )
    assert details == "n must be in [0, 3] (the width of words, axis 1), got 4 at row 1"
    details = budget_error(
        lambda: budget.prepare({"words": np.full((2, 3), b"w", object), "n": np.array([1], np.int32)}), INVALID
    )
    assert details == "n must have one entry per row of words: got 1 lengths for 2 rows"
    assert "input 'words' is 3 rows x 7 tokens wide" in budget_error(
        lambda: budget.prepare({"words": np.full((3, 7), b"w", object), "n": np.ones(3, np.int32)})
    )
    budget = sentences_budget(Limits(max_tokens_per_sentence=2), alias="text")
    assert budget.signature.sentence_inputs == ("text",) and budget.signature.padded_input is None
    assert "sentence 0 of input 'text' has 3 tokens" in budget_error(
        lambda: budget.prepare({"text": np.array([b"a b c"], object)})
    )
