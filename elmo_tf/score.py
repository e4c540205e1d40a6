"""Scores every line of a text file with a `LanguageModel`: one JSON line per input line (`elmo-tf score`).

Each record holds `tokens` (the line split on ASCII whitespace, decoded as UTF-8 with invalid bytes as lone surrogates,
as `embed`'s keys), `forward_log_probs` and `backward_log_probs` (n + 1 values each, `sentence_log_probs`'s order),
and with a top k, `forward_top_k` / `backward_top_k`: per position a list of `[word, log_prob]`, most likely first.
The input is read once, as a stream; batches are written as they are scored, in file order, to a temporary file that
is renamed to the output at the end (`elmo_tf.io.atomic`).
"""

import json

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.io.atomic import atomic_path, write_error
from elmo_tf.io.sentences import iter_sentences
from elmo_tf.models.language_model import DIRECTIONS

DEFAULT_BATCH_SIZE = 32


def _text(token):
    return token.decode("utf-8", "surrogateescape")


def batches(sentences, batch_size, max_batch_tokens=None):
    """Groups `Sentence`s in file order: at most `batch_size` per batch and rows x the longest sentence at most
    `max_batch_tokens` (a longer sentence goes alone)."""
    batch, longest = [], 0
    for sentence in sentences:
        width = max(longest, len(sentence.tokens))
        if batch and (len(batch) == batch_size or (max_batch_tokens and (len(batch) + 1) * width > max_batch_tokens)):
            yield batch
            batch, width = [], len(sentence.tokens)
        batch.append(sentence)
        longest = width
    if batch:
        yield batch


class ScoreError(ElmoTFError):
    """Scores that cannot be written: the model gives NaN or inf (its weights overflow float32). Names the line."""


def _check_finite(outputs, row, end, sentence, path):
    for key, value in outputs.items():
        if value.dtype.kind == "f" and not np.isfinite(value[row, :end]).all():
            raise ScoreError(
                f"{path}:{sentence.index + 1}: the model's {key} are not finite (NaN or inf): its weights or softmax "
                "overflow float32 (JSON has no NaN; nothing was written)",
                path=str(path),
                line=sentence.index + 1,
            )


def records(outputs, sentences, top_k, path=None):
    """The JSON records (dicts) of one scored batch (`path`: the input, named by `ScoreError`)."""
    result = []
    for row, sentence in enumerate(sentences):
        end = len(sentence.tokens) + 1
        _check_finite(outputs, row, end, sentence, path)
        record = {"tokens": [_text(t) for t in sentence.tokens]}
        for direction in DIRECTIONS:
            record[f"{direction}_log_probs"] = outputs[f"{direction}_log_probs"][row, :end].tolist()
        if top_k:
            for direction in DIRECTIONS:
                words = outputs[f"{direction}_top_k_words"][row, :end]
                log_probs = outputs[f"{direction}_top_k_log_probs"][row, :end].tolist()
                record[f"{direction}_top_k"] = [
                    [[_text(w), p] for w, p in zip(ws, ps)] for ws, ps in zip(words, log_probs)
                ]
        result.append(record)
    return result


def scorer(lm):
    """A `tf.function` tokens `(batch, T)` tf.string -> the numpy outputs of `lm.score_tokens`."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string)])
    def run(tokens):
        return lm.score_tokens(tokens)

    def call(token_lists):
        width = max(len(t) for t in token_lists)
        padded = [list(t) + [b""] * (width - len(t)) for t in token_lists]
        tokens = tf.constant(padded, tf.string) if width else tf.zeros([len(padded), 0], tf.string)
        return {key: value.numpy() for key, value in run(tokens).items()}

    return call


def score_file(
    lm, input_path, output_path, batch_size=DEFAULT_BATCH_SIZE, max_batch_tokens=None, progress=None, max_tokens=None
):
    """Writes one JSON line per line of `input_path` to `output_path` (atomically); returns `{"sentences",
    "tokens"}` counted.

    Args:
        lm: a `LanguageModel` with a vocabulary attached (`load_language_model`).
        batch_size: sentences per model call; max_batch_tokens: cap on rows x the longest sentence (None: none).
        progress: optional callable(sentences done).
        max_tokens: cut longer lines to their first `max_tokens` tokens (None: never).
    Raises:
        elmo_tf.io.text.TextFileError: an unreadable input line (the message names it); WriteError: a full disk
            (the temporary is removed, an existing output kept); ScoreError: NaN or inf scores (naming the line).
    """
    batch_size = check_int("batch_size", batch_size, 1)
    check_int("max_batch_tokens", max_batch_tokens, 1, allow_none=True)
    run = scorer(lm)
    stats = {"sentences": 0, "tokens": 0}
    try:
        with atomic_path(output_path) as tmp, open(tmp, "w", encoding="utf-8") as out:
            for batch in batches(iter_sentences(input_path, max_tokens), batch_size, max_batch_tokens):
                outputs = run([s.tokens for s in batch])
                for record in records(outputs, batch, lm.top_k, input_path):
                    out.write(json.dumps(record, allow_nan=False) + "\n")
                stats["sentences"] += len(batch)
                stats["tokens"] += sum(len(s.tokens) for s in batch)
                if progress:
                    progress(len(batch))
    except OSError as e:
        raise (write_error(output_path, e) or e) from None
    return stats
