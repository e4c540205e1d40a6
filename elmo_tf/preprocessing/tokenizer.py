"""Raw sentences -> padded tokens, in TF ops (runs in tf.data and inside SavedModels), and its Python twin.

Tokenizers (`TOKENIZERS`):
    `whitespace` (default): runs of ASCII whitespace (space, \\t, \\n, \\v, \\f, \\r), core `tf.strings.split`;
        loads in any TF runtime. Bytes are kept as they are (invalid UTF-8 included).
    `unicode_script`: tensorflow-text's `UnicodeScriptTokenizer`: splits on whitespace and where the Unicode
        script changes, so punctuation is split from words ("aren't." -> "aren", "'", "t", "."); invalid UTF-8
        becomes U+FFFD. A process loading a graph that uses it must load the tf-text ops first
        (`import tensorflow_text` in Python, `tf_text_op_library()` via `TF_LoadLibrary` in C++); the stock
        `tensorflow_model_server` registers them itself.
`split_tokens` is the whitespace tokenizer in Python (bytes or str in, the same tokens out), for code that
reads text files outside a graph: one definition of "a token", whichever side runs it.

TensorFlow is imported by the functions that build ops, so `TOKENIZERS`, `split_tokens` and the checks serve code that
must not load it (the command lines' parsers, `elmo_tf.io.vocabulary`).
"""

import importlib.util
import os

TOKENIZERS = ("whitespace", "unicode_script")
TF_TEXT_OP_LIBRARY = "_unicode_script_tokenizer.so"  # registers UnicodeScriptTokenizeWithOffsets


def split_tokens(sentence):
    """The `whitespace` tokenizer in Python: `bytes` or `str` -> list of tokens of the same type.

    Splits on runs of ASCII whitespace only, as `tf.strings.split` does (`str.split()` would also split on
    Unicode spaces such as U+00A0, which the graph keeps inside tokens).
    """
    if isinstance(sentence, str):
        return [t.decode("utf-8", "surrogateescape") for t in split_tokens(sentence.encode("utf-8", "surrogateescape"))]
    return bytes(sentence).split()  # bytes.split() splits on exactly the ASCII whitespace above


def whitespace_tokenize(sentences, max_tokens=None):
    """Splits each sentence on runs of ASCII whitespace: `(batch,)` tf.string -> tokens, lengths.

    Args:
        sentences: tf.string `(batch,)`.
        max_tokens: optional int; sentences with more tokens are cut to their first `max_tokens`.
    Returns:
        tokens: tf.string `(batch, tokens)`, padded with "" (an empty sentence is a row of "").
        sequence_len: int32 `(batch,)`, the number of real tokens per sentence.
    """
    import tensorflow as tf  # deferred: see the module docstring

    sentences = tf.convert_to_tensor(sentences)
    if sentences.dtype != tf.string:
        raise TypeError(f"sentences must be a tf.string tensor, got dtype {sentences.dtype.name}")
    if sentences.shape.rank is not None and sentences.shape.rank != 1:
        raise ValueError(f"sentences must have rank 1 (batch,), got shape {sentences.shape}")
    ragged = tf.strings.split(sentences)
    if max_tokens is not None:
        ragged = ragged[:, :max_tokens]
    tokens = ragged.to_tensor(default_value="")
    return tokens, tf.cast(ragged.row_lengths(), tf.int32)


def check_tokenizer(tokenizer):
    """Raises ValueError unless `tokenizer` is one of `TOKENIZERS`."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")


def check_max_tokens(max_tokens):
    """Raises ValueError unless `max_tokens` is None or a positive int."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be None or a positive int, got {max_tokens!r}")


def make_tokenizer(tokenizer="whitespace", max_tokens=None):
    """A graph function `sentences (batch,) -> (tokens (batch, T) padded with "", sequence_len int32 (batch,))`.

    Args:
        tokenizer: one of `TOKENIZERS`.
        max_tokens: optional int; every sentence is cut to its first `max_tokens` tokens.
    """
    check_tokenizer(tokenizer)
    check_max_tokens(max_tokens)
    if tokenizer == "whitespace":
        return lambda sentences: whitespace_tokenize(sentences, max_tokens=max_tokens)
    import tensorflow as tf  # deferred: see the module docstring
    import tensorflow_text  # registers the ops

    splitter = tensorflow_text.UnicodeScriptTokenizer()

    def unicode_script_tokenize(sentences):
        ragged = splitter.tokenize(sentences)
        if max_tokens is not None:
            ragged = ragged[:, :max_tokens]
        return ragged.to_tensor(default_value=""), tf.cast(ragged.row_lengths(), tf.int32)

    return unicode_script_tokenize


def tf_text_op_library():
    """Path of tensorflow-text's op library holding the UnicodeScriptTokenizer ops (for C++ loaders)."""
    spec = importlib.util.find_spec("tensorflow_text")
    if spec is None:
        raise ImportError("tensorflow-text is not installed (pip install tensorflow-text)")
    return os.path.join(spec.submodule_search_locations[0], "python", "ops", TF_TEXT_OP_LIBRARY)
