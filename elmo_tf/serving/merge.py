"""Merged calls: several requests to one signature run as one model call, each getting exactly its own outputs.

The inputs of the requests are concatenated along axis 0, the padded input padded to the widest request with ""
(0 for numbers), which the `tokens` signature ignores beyond `sequence_len`. The outputs are split back by rows, and
outputs with a dynamic axis 1 (`word_emb`, `lstm_outputs*`, `elmo`, `mask`) cut to the width the request alone would
have had: `min(own width, merged width)` with a padded input, else the request's longest output length. A request's
outputs are therefore the same, shape included, whether it was merged or not. If a merged call fails, its requests
are run one by one, so one request's error never reaches another. Only a `Signature.mergeable` signature is merged.
"""

import logging

import numpy as np

logger = logging.getLogger(__name__)


def merge_inputs(signature, requests):
    """The inputs of `requests` (checked `budget.Request`s) as one batch: alias -> array."""
    width = max(r.width for r in requests) if signature.padded_input else 0
    merged = {}
    for alias, spec in signature.inputs.items():
        parts = []
        for r in requests:
            part = r.inputs[alias]
            if alias == signature.padded_input and part.shape[1] < width:
                padded = np.full((part.shape[0], width), b"" if spec.is_string else 0, dtype=part.dtype)
                padded[:, : part.shape[1]] = part
                part = padded
            parts.append(part)
        merged[alias] = np.concatenate(parts, axis=0)
    return merged


def split_outputs(signature, outputs, requests):
    """The outputs of a merged call split back per request (rows, and the request's own width; outputs wider than the
    padded input by `extra` positions, as the `lm` signature's `T + 1`, are that much wider for each request)."""
    merged_time = next((outputs[a].shape[1] for a in sorted(signature.time_outputs) if a in outputs), 0)
    extra = max(merged_time - max(r.width for r in requests), 0) if signature.padded_input else 0
    results, start = [], 0
    for r in requests:
        rows = slice(start, start + r.batch)
        start += r.batch
        if signature.padded_input:
            own = min(r.width, merged_time - extra) + extra
        else:
            lengths = outputs[signature.lengths_output][rows] if signature.time_outputs else np.zeros(0)
            own = min(int(lengths.max()) if lengths.size else 0, merged_time)
        results.append(
            {
                alias: value[rows, :own] if alias in signature.time_outputs else value[rows]
                for alias, value in outputs.items()
            }
        )
    return results


def run_batch(runner, requests):
    """Runs `requests` (list of `budget.Request`) of `runner` (`servable.SignatureRunner`) in one call when there are
    several and its signature is mergeable; returns, per request, its outputs (alias -> array, all outputs) or the
    `ServingError` it failed with."""
    if len(requests) == 1 or not runner.signature.mergeable:
        return [runner.run_one(r) for r in requests]
    try:
        outputs = runner.run(merge_inputs(runner.signature, requests))
    except Exception as e:  # one bad request must not fail the others: retry them alone
        logger.warning(
            "merged call of %d requests to %s failed (%s); running them one by one", len(requests), runner.name, e
        )
        return [runner.run_one(r) for r in requests]
    return split_outputs(runner.signature, outputs, requests)
