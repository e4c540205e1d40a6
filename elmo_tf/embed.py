"""Embedding many sentences with an `ELMo` model: length-aware batching, order restored by index.

The library side of `python -m elmo_tf embed`; nothing here prints.
"""

import json

import h5py
import numpy as np
import tensorflow as tf

from elmo_tf.io.atomic import atomic_path
from elmo_tf.preprocessing.chars import MAX_CHARS, tokens_to_char_ids
from elmo_tf.preprocessing.tokenizer import split_tokens

LAYER_CHOICES = ("all", "top", "average")


def plan_batches(lengths, batch_size=64, max_batch_tokens=None, sort=True, window=None):
    """Groups sentence indices into batches: lists of indices, every sentence exactly once.

    With `sort`, sentences are sorted by length inside windows of `window` sentences (default
    `50 * batch_size`), so a batch holds similar lengths and a window is all that must be in memory.
    A batch closes at `batch_size` sentences or when its padded size `rows * longest` would pass
    `max_batch_tokens`; a sentence longer than `max_batch_tokens` gets a batch of its own.
    Empty sentences (length 0) are not batched; the caller writes them directly.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    window = window or 50 * batch_size
    indices = [i for i, n in enumerate(lengths) if n > 0]
    batches = []
    for start in range(0, len(indices), window):
        chunk = indices[start : start + window]
        if sort:
            chunk = sorted(chunk, key=lambda i: lengths[i])
        batch, longest = [], 0
        for i in chunk:
            new_longest = max(longest, lengths[i])
            if batch and (
                len(batch) == batch_size
                or (max_batch_tokens is not None and (len(batch) + 1) * new_longest > max_batch_tokens)
            ):
                batches.append(batch)
                batch, new_longest = [], lengths[i]
            batch.append(i)
            longest = new_longest
        if batch:
            batches.append(batch)
    return batches


class Embedder:
    """Runs an `ELMo` model on lists of tokens, compiled once for any batch and length.

    Args:
        model: an `ELMo` model.
        layers: "all" -> `(L+1, n, 2P)`, "top" -> `(n, 2P)`, "average" -> `(n, 2P)` (mean of the L+1 layers).
    """

    def __init__(self, model, layers="all"):
        if layers not in LAYER_CHOICES:
            raise ValueError(f"layers must be one of {LAYER_CHOICES}, got {layers!r}")
        self.model = model
        self.layers = layers

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string)])
        def run(tokens):
            acts = self.model(tokens_to_char_ids(tokens))["activations"]
            if layers == "all":
                return tf.stack(acts, axis=1)  # (batch, L+1, tokens, 2P)
            if layers == "top":
                return acts[-1]
            return tf.add_n(acts) / len(acts)

        self._run = run

    @property
    def empty_shape(self):
        width = 2 * self.model.config.projection_dim
        return (self.model.num_output_layers, 0, width) if self.layers == "all" else (0, width)

    def embed_batch(self, sentences):
        """`sentences`: list of token lists (bytes or str). Returns one float32 array per sentence."""
        longest = max((len(s) for s in sentences), default=0)
        if longest == 0:
            return [np.zeros(self.empty_shape, np.float32) for _ in sentences]
        padded = [list(s) + [b""] * (longest - len(s)) for s in sentences]
        out = self._run(tf.constant(padded, tf.string)).numpy()
        if self.layers == "all":
            return [out[k, :, : len(s)] for k, s in enumerate(sentences)]
        return [out[k, : len(s)] for k, s in enumerate(sentences)]


def read_sentences(path):
    """One whitespace-tokenized sentence per line, as lists of bytes tokens (ASCII whitespace, like
    `tf.strings.split`; invalid UTF-8 is kept byte for byte). Returns (token lists, raw lines)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    return [split_tokens(line) for line in lines], lines


def embed_file(
    model,
    input_path,
    output_path,
    batch_size=64,
    layers="all",
    max_batch_tokens=None,
    sort=True,
    max_sentence_tokens=None,
    progress=None,
):
    """Writes one dataset per input line ("0", "1", ...) plus `sentence_to_index` to `output_path` (hdf5).

    Empty lines give a dataset with 0 tokens; sentences longer than `max_sentence_tokens` (when set)
    are cut to that many tokens, otherwise they are embedded whole, in a batch of their own when they
    pass `max_batch_tokens`. The file is written under a temporary name and renamed at the end.

    Args:
        progress: optional callable `progress(n_sentences_done)` called after each batch.
    Returns:
        dict of counts: sentences, tokens, empty, truncated.
    """
    sentences, lines = read_sentences(input_path)
    truncated = 0
    if max_sentence_tokens is not None:
        if max_sentence_tokens < 1:
            raise ValueError(f"max_sentence_tokens must be >= 1, got {max_sentence_tokens}")
        truncated = sum(len(s) > max_sentence_tokens for s in sentences)
        sentences = [s[:max_sentence_tokens] for s in sentences]
    if max_batch_tokens is None:
        max_batch_tokens = batch_size * 128
    embedder = Embedder(model, layers)
    lengths = [len(s) for s in sentences]
    # hidden temporary beside the output, renamed at the end; a killed run's temporary goes at the next run
    with atomic_path(output_path) as tmp, h5py.File(tmp, "w") as f:
        empty = [i for i, n in enumerate(lengths) if n == 0]
        for i in empty:
            f.create_dataset(str(i), data=np.zeros(embedder.empty_shape, np.float32))
        if progress and empty:
            progress(len(empty))
        for batch in plan_batches(lengths, batch_size, max_batch_tokens, sort):
            for i, array in zip(batch, embedder.embed_batch([sentences[i] for i in batch])):
                f.create_dataset(str(i), data=array)
            if progress:
                progress(len(batch))
        index = {line.decode("utf-8", "replace"): str(i) for i, line in enumerate(lines)}
        f.create_dataset(
            "sentence_to_index", data=np.array([json.dumps(index)], dtype=object), dtype=h5py.string_dtype()
        )
    return {"sentences": len(sentences), "tokens": sum(lengths), "empty": len(empty), "truncated": truncated}


__all__ = ["Embedder", "LAYER_CHOICES", "MAX_CHARS", "embed_file", "plan_batches", "read_sentences"]
