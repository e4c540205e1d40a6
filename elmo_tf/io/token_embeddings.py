"""Cached context-free token vectors, in the file layout of bilm-tf's `dump_token_embeddings` and AllenNLP's
`vocab_to_cache`.

The vector of a token is the output of the char CNN (char embedding -> convolutions -> highway -> projection) for
that token alone, without context: it can be computed once per vocabulary word and looked up afterwards.

Layout (the AllenNLP fixture `elmo_token_embeddings.hdf5`):
    embedding    float32 (vocabulary size, projection_dim)    row j: the vector of line j of the vocabulary file
and nothing else. Readers take `f["embedding"][...]`; bilm-tf prepends a zero row for padding, so its token id is
the vocabulary index + 1. Files written here also carry two hdf5 *attributes* (readers of the datasets do not see
them): `vocabulary_size` and `vocabulary_sha256` (of the tokens joined by b"\\n"), so that a cache read with
another vocabulary is refused instead of silently giving every word the wrong vector.

Example:
    elmo = load_elmo("options.json", "weights.hdf5")
    dump_token_embeddings(elmo, "vocab.txt", "token_embeddings.hdf5")
    table = load_token_embeddings("token_embeddings.hdf5", "vocab.txt")   # (V, P) float32
"""

import hashlib
import os

import h5py
import numpy as np

from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.io.atomic import atomic_hdf5
from elmo_tf.io.bilm_hdf5 import _H5_ERRORS, WeightFileError, open_hdf5, read_dataset
from elmo_tf.io.text import TextFileError, raw_lines
from elmo_tf.preprocessing.chars import token_bytes

EMBEDDING = "embedding"
SIZE_ATTR = "vocabulary_size"
DIGEST_ATTR = "vocabulary_sha256"
DEFAULT_BATCH_SIZE = 1024

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.split() and tf.strings.split split on


class TokenEmbeddingError(ElmoTFError):
    """A vocabulary file or a token embedding file that cannot be used. The message names the file and, for a
    vocabulary, the line (`path:line: ...`)."""


def _show(token, limit=60):
    """A token (bytes) for an error message: decoded, invalid UTF-8 as \\x escapes, cut to `limit` characters."""
    text = token.decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def vocabulary_digest(tokens):
    """The sha256 (hex) of the tokens (str or bytes; str as UTF-8) joined by b"\\n": the `vocabulary_sha256`
    attribute of a token embedding file."""
    return hashlib.sha256(b"\n".join(token_bytes(t) for t in tokens)).hexdigest()


def read_vocabulary(path):
    """The tokens of a vocabulary file, one per line, as bytes: `list[bytes]`, index j = line j + 1.

    Lines are read with `elmo_tf.io.text.raw_lines`: a UTF-8 byte order mark is skipped, "\\r\\n" is accepted,
    bytes are kept as they are (invalid UTF-8 included, as the embedder keeps them). A final newline is optional
    (with or without it the list is the same).

    Raises:
        TokenEmbeddingError: naming `path` and the line: a missing file or a directory, a UTF-16/UTF-32 file or
            NUL bytes; an empty line (blank lines at the end included: row j must be line j + 1); a token
            holding ASCII whitespace (it could never match a whitespace-split token); a duplicate token (both
            line numbers named); a file without any token.
    """
    tokens, seen = [], {}
    try:
        for number, _, token in raw_lines(path):
            if not token:
                raise TokenEmbeddingError(f"{path}:{number}: empty line; a vocabulary holds one token on every line")
            blank = next((k for k, byte in enumerate(token) if byte in _WHITESPACE), None)
            if blank is not None:
                raise TokenEmbeddingError(
                    f"{path}:{number}: token {_show(token)} holds whitespace (byte 0x{token[blank]:02x} at "
                    f"position {blank}); text is split on ASCII whitespace, so this token could never be looked up"
                )
            if token in seen:
                raise TokenEmbeddingError(
                    f"{path}:{number}: duplicate token {_show(token)}, already on line {seen[token]}"
                )
            seen[token] = number
            tokens.append(token)
    except TextFileError as e:
        raise TokenEmbeddingError(str(e)) from None
    if not tokens:
        raise TokenEmbeddingError(f"{path}: the file is empty; a vocabulary needs at least one token (one per line)")
    return tokens


def compute_token_embeddings(model, tokens, batch_size=DEFAULT_BATCH_SIZE, progress=None):
    """The context-free vector of every token: `model.char_cnn` on char ids `(n, 1, 50)`, `batch_size` tokens at a
    time (memory stays bounded whatever the number of tokens; the result is `len(tokens) x P` floats).

    Tokens map to char ids by the model's own mapping (`model.char_mapping`: bilm-tf's UTF-8 bytes, tokens cut to
    48 bytes, `<S>` / `</S>` the sentence boundaries; or a converted ELMoForManyLangs model's char vocabulary, cut
    to 48 code points, `<bos>` / `<eos>`, with the word id column); the empty token gives a zero row (padding).

    Args:
        model: an `elmo_tf.models.ELMo` (anything with a `char_cnn` layer and the `char_mapping` of its inputs).
        tokens: sequence of str or bytes (str as UTF-8).
        batch_size: tokens per call of the char CNN (>= 1). The results agree across batch sizes up to float32
            rounding (a few units in the last place), not bit for bit.
        progress: optional callable, given the number of tokens done after each batch.
    Returns:
        float32 `(len(tokens), projection_dim)`; row j is the vector of `tokens[j]`.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    char_cnn = getattr(model, "char_cnn", None)
    if char_cnn is None:
        raise TypeError(f"model must be an elmo_tf ELMo model (with a char_cnn layer), got {type(model).__name__}")
    if isinstance(tokens, str | bytes):
        raise TypeError(f"tokens must be a sequence of tokens, got a single {type(tokens).__name__}")
    mapping = getattr(model, "char_mapping", None)
    if mapping is None:
        raise TypeError(f"model must be an elmo_tf ELMo model (with a char_mapping), got {type(model).__name__}")
    tokens = list(tokens)
    import tensorflow as tf  # (the rest of this module, and the Embedder that imports it, run on every backend)

    # one trace for every batch (the batch dimension is dynamic); much faster than eager calls for small batches
    encode = tf.function(char_cnn, input_signature=[tf.TensorSpec([None, 1, mapping.width], tf.int32)], autograph=False)
    rows = []
    for start in range(0, max(len(tokens), 1), batch_size):  # no tokens: one empty batch gives the width
        batch = tokens[start : start + batch_size]
        ids = mapping.numpy(batch).reshape(len(batch), 1, mapping.width)
        rows.append(np.asarray(encode(tf.constant(ids))[:, 0], np.float32))
        if progress is not None and batch:
            progress(len(batch))
    return np.concatenate(rows, axis=0)


def _check_embedding(embedding, vocabulary):
    array = np.asarray(embedding)
    if array.ndim != 2:
        raise ValueError(f"embedding must be 2-D (vocabulary size, projection_dim), got shape {array.shape}")
    if array.dtype.kind not in "fiu":
        raise ValueError(f"embedding must hold real numbers, got dtype {array.dtype}")
    if not np.all(np.isfinite(array)):
        raise ValueError("embedding holds NaN or inf values")
    if vocabulary is not None and len(vocabulary) != array.shape[0]:
        raise ValueError(f"embedding has {array.shape[0]} rows but the vocabulary has {len(vocabulary)} tokens")
    return array.astype(np.float32)


def write_token_embeddings(path, embedding, vocabulary=None):
    """Writes a token embedding file: dataset `embedding`, float32 `(V, P)`, nothing else (bilm-tf/AllenNLP layout).

    Written atomically (`elmo_tf.io.atomic`): an existing file is replaced whole or left as it was.

    Args:
        path: the hdf5 file to write.
        embedding: real array `(V, P)` (stored as float32), finite.
        vocabulary: optional sequence of the V tokens (str or bytes), row j = `vocabulary[j]`; when given, the
            attributes `vocabulary_size` and `vocabulary_sha256` record it, and `load_token_embeddings` refuses
            the file with any other vocabulary.
    Raises:
        ValueError: `embedding` not 2-D, not real, with NaN/inf, or with a row count other than the vocabulary's.
        elmo_tf.io.atomic.WriteError: the disk refused the file (full, a file-size limit); the old file is kept.
    """
    array = _check_embedding(embedding, vocabulary)
    with atomic_hdf5(path) as f:
        f.create_dataset(EMBEDDING, data=array)
        if vocabulary is not None:
            f.attrs[SIZE_ATTR] = np.int64(len(vocabulary))
            f.attrs[DIGEST_ATTR] = vocabulary_digest(vocabulary)


def _vocabulary_tokens(vocabulary):
    """`(tokens as bytes, how to name them in a message)` of a vocabulary path or token sequence."""
    if isinstance(vocabulary, str | os.PathLike):
        return read_vocabulary(vocabulary), f"the vocabulary {os.fspath(vocabulary)}"
    if isinstance(vocabulary, bytes):
        raise TypeError("vocabulary must be a file path or a sequence of tokens, got bytes")
    return [token_bytes(t) for t in vocabulary], "the vocabulary given"


def _attribute(f, name, path):
    try:
        value = f.attrs.get(name)
    except _H5_ERRORS as e:
        raise TokenEmbeddingError(f"{path}: attribute {name!r} cannot be read: {one_line(e)}") from None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    return value


def load_token_embeddings(path, vocabulary, projection_dim=None):
    """Reads a token embedding file written for `vocabulary`, checked: float32 `(V, P)`, row j = token j.

    Args:
        path: hdf5 file with dataset `embedding` (bilm-tf, AllenNLP or `write_token_embeddings`).
        vocabulary: the vocabulary file's path (read with `read_vocabulary`) or the sequence of its V tokens.
        projection_dim: the width P the model expects (None: any).
    Returns:
        float32 `(V, P)`, without the zero padding row that bilm-tf prepends.
    Raises:
        TokenEmbeddingError: naming `path` and what is wrong: a missing, truncated or non-HDF5 file; one that points
            outside itself (an external or soft link, a virtual dataset, external storage, a filter plugin:
            `elmo_tf.io.hdf5_safety`, refused before any data is read); no dataset
            `embedding`; one that is not 2-D, not floating point, with a row count other than V or a width other
            than `projection_dim`, unreadable, or with NaN/inf values; or a `vocabulary_sha256` attribute (files
            without it, as the bilm-tf/AllenNLP ones, are accepted) that is not the vocabulary's: the message
            gives both sizes and digests. Also for a bad vocabulary file (`read_vocabulary`).
    """
    tokens, vocabulary_name = _vocabulary_tokens(vocabulary)
    if projection_dim is not None and (
        isinstance(projection_dim, bool) or not isinstance(projection_dim, int | np.integer) or projection_dim < 1
    ):
        raise ValueError(f"projection_dim must be a positive int or None, got {projection_dim!r}")
    try:
        f = open_hdf5(path, what="token embedding file")
    except WeightFileError as e:
        raise TokenEmbeddingError(str(e)) from None
    with f:
        written_digest, written_size = _attribute(f, DIGEST_ATTR, path), _attribute(f, SIZE_ATTR, path)
        digest = vocabulary_digest(tokens)
        if written_digest is not None and str(written_digest) != digest:
            size = "?" if written_size is None else written_size
            raise TokenEmbeddingError(
                f"{path}: was written for another vocabulary ({size} tokens, sha256 {str(written_digest)[:16]}...) "
                f"than {vocabulary_name} ({len(tokens)} tokens, sha256 {digest[:16]}...)"
            )
        try:
            obj = f.get(EMBEDDING)
            dtype, shape = (obj.dtype, obj.shape) if isinstance(obj, h5py.Dataset) else (None, None)
        except _H5_ERRORS as e:
            raise TokenEmbeddingError(
                f"{path}: dataset {EMBEDDING!r} cannot be read (corrupt file?): {one_line(e)}"
            ) from None
        if obj is None:
            raise TokenEmbeddingError(
                f"{path}: has no dataset {EMBEDDING!r} (a token embedding file holds one dataset {EMBEDDING!r} "
                f"of shape (vocabulary size, projection_dim)); datasets: {sorted(f.keys())[:5]}"
            )
        if not isinstance(obj, h5py.Dataset):
            raise TokenEmbeddingError(f"{path}: {EMBEDDING!r} is a {type(obj).__name__}, not a dataset")
        if h5py.check_string_dtype(dtype) is not None or dtype.kind != "f":
            held = "strings" if h5py.check_string_dtype(dtype) is not None else f"dtype {dtype}"
            raise TokenEmbeddingError(f"{path}: dataset {EMBEDDING!r} holds {held}, expected floating point")
        if len(shape) != 2:
            raise TokenEmbeddingError(
                f"{path}: dataset {EMBEDDING!r} has shape {shape}, expected 2-D (vocabulary size, projection_dim)"
            )
        if shape[0] != len(tokens):
            raise TokenEmbeddingError(
                f"{path}: dataset {EMBEDDING!r} has {shape[0]} rows but {vocabulary_name} has {len(tokens)} "
                "tokens (one row per token, in vocabulary order)"
            )
        if projection_dim is not None and shape[1] != projection_dim:
            raise TokenEmbeddingError(
                f"{path}: dataset {EMBEDDING!r} has width {shape[1]}, but the model's projection_dim is "
                f"{projection_dim}"
            )
        try:  # what is left to check: the data reads (a truncated file fails here) and is finite
            data = read_dataset(f, EMBEDDING, [shape], path)
        except WeightFileError as e:
            raise TokenEmbeddingError(str(e)) from None
    return np.asarray(data, np.float32)


def dump_token_embeddings(model, vocabulary_path, output_path, batch_size=DEFAULT_BATCH_SIZE, progress=None):
    """`read_vocabulary` + `compute_token_embeddings` + `write_token_embeddings` (with the vocabulary attributes):
    what bilm-tf's `dump_token_embeddings(vocab_file, options_file, weight_file, outfile)` does, for a loaded model.

    Returns:
        the number of tokens written.
    Raises:
        TokenEmbeddingError: a bad vocabulary file (naming the file and line). `output_path` is replaced whole, or
            left as it was on any error.
    """
    tokens = read_vocabulary(vocabulary_path)
    embedding = compute_token_embeddings(model, tokens, batch_size=batch_size, progress=progress)
    write_token_embeddings(output_path, embedding, vocabulary=tokens)
    return len(tokens)
