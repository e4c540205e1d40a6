"""Exports an ELMo model as a versioned SavedModel for TF Serving: `<base>/<version>/` (DESIGN.md, "Serving contract").

Signatures (the TF Hub ELMo module's names):
    `default` (also `serving_default`): `sentences` tf.string `(batch,)`, tokenized in the graph.
    `tokens`: `tokens` tf.string `(batch, tokens)` padded with "", `sequence_len` int32 `(batch,)`.
Outputs of both, `T` = the longest sentence of the batch (the `tokens` input's width for `tokens`):
    `word_emb` float32 `(batch, T, P)`: the char-CNN token layer.
    `lstm_outputs1`, `lstm_outputs2`, ... float32 `(batch, T, 2P)`: each biLM layer, forward and backward halves.
    `elmo` float32 `(batch, T, 2P)`: the model's (first) ScalarMix.
    `default` float32 `(batch, 2P)`: the mean of `elmo` over each sentence's real tokens (zeros for an empty one).
    `sequence_len` int32 `(batch,)`: real tokens per sentence.
    `mask` bool `(batch, T)`: True for real tokens. The TF Hub module documents no mask output; bool is what bilm-tf's
        `BidirectionalLanguageModel` returned as `mask` and what `elmo_tf.ELMo` returns.
All outputs are 0 (False) at padded positions. Batch and time dimensions are dynamic.

Edge cases (documented results, never a crash):
    - an empty or all-whitespace sentence: `sequence_len` 0, a row of zeros in every output, `default` zeros;
    - an empty batch `(0,)`: every output with batch 0 (and T 0);
    - `tokens` beyond `sequence_len` are ignored whatever they hold; an "" token inside `sequence_len` is embedded
      as a token without characters (begin-of-word, end-of-word), as AllenNLP's char mapper does;
    - `sequence_len` outside `[0, tokens width]`, or a batch size that differs from `tokens`', fails the request
      with INVALID_ARGUMENT and a message naming `sequence_len`;
    - bytes are used as they are (invalid UTF-8 included) by the whitespace tokenizer; tensorflow-text's
      tokenizer replaces invalid UTF-8 with U+FFFD; tokens are cut to their first 48 bytes (the char mapping).

Tokenizers: `whitespace` (default; core `tf.strings.split`: runs of ASCII whitespace; loads in any TF runtime)
or `unicode_script` (tensorflow-text's `UnicodeScriptTokenizer`: splits on whitespace and where the Unicode
script changes, so punctuation is split from words: "aren't." -> "aren", "'", "t", "."). A process loading a
`unicode_script` export must load the tf-text ops first: `import tensorflow_text` in Python,
`tensorflow_text/python/ops/_unicode_script_tokenizer.so` via `TF_LoadLibrary` in C++; the stock
`tensorflow_model_server` registers these ops itself.

Written with `keras.export.ExportArchive` (track + add_endpoint): `tf.saved_model.save` of a `tf.Module`
holding a Keras 3 model loads in Python but fails in TF Serving's C++ loader (tensorflow/serving#2226).
A version is written to a hidden temporary directory next to it, checked, then renamed into place, so a
model server polling `<base>` never sees a half-written version; an existing version is never overwritten.
"""

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

from elmo_tf.cli import positive_int  # noqa: E402
from elmo_tf.preprocessing.chars import BOW, EOW, MAX_CHARS, PAD, tokens_to_char_ids  # noqa: E402
from elmo_tf.preprocessing.tokenizer import whitespace_tokenize  # noqa: E402

logger = logging.getLogger("export_savedmodel")

SENTENCES_SIGNATURE = "default"
TOKENS_SIGNATURE = "tokens"
SERVING_DEFAULT = "serving_default"
SIGNATURES = (SENTENCES_SIGNATURE, SERVING_DEFAULT, TOKENS_SIGNATURE)
TOKENIZERS = ("whitespace", "unicode_script")
TF_TEXT_OP_LIBRARY = "_unicode_script_tokenizer.so"  # registers UnicodeScriptTokenizeWithOffsets
PARITY_ATOL = 1e-5
CHECK_SENTENCES = (
    "The cat sat on the mat .",
    "Dogs are in the fog , aren't they ?",
    "ELMo",
    "",
    "Zürich , 2018 : naïve café !",
)

# a token without characters (AllenNLP's char mapping of "")
_EMPTY_TOKEN_CHAR_IDS = np.array([BOW, EOW] + [PAD] * (MAX_CHARS - 2), np.int32)


class ExportError(RuntimeError):
    """An export that could not be written or whose reloaded outputs differ from the Keras model's."""


def output_keys(num_layers):
    """The output names of every signature, for an L-layer biLM."""
    return (
        ["word_emb"]
        + [f"lstm_outputs{layer}" for layer in range(1, num_layers + 1)]
        + ["elmo", "default", "sequence_len", "mask"]
    )


def tf_text_op_library():
    """Path of tensorflow-text's op library holding the UnicodeScriptTokenizer ops (for C++ loaders)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow_text")
    if spec is None:
        raise ImportError("tensorflow-text is not installed (pip install tensorflow-text)")
    return os.path.join(spec.submodule_search_locations[0], "python", "ops", TF_TEXT_OP_LIBRARY)


def _check_tokenizer(tokenizer):
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")


def _check_max_tokens(max_tokens):
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be None or a positive int, got {max_tokens!r}")


def make_tokenizer(tokenizer="whitespace", max_tokens=None):
    """A graph function `sentences (batch,) -> (tokens (batch, T) padded with "", sequence_len int32 (batch,))`."""
    _check_tokenizer(tokenizer)
    _check_max_tokens(max_tokens)
    if tokenizer == "whitespace":
        return lambda sentences: whitespace_tokenize(sentences, max_tokens=max_tokens)
    import tensorflow_text  # noqa: F401  (registers the ops)

    splitter = tensorflow_text.UnicodeScriptTokenizer()

    def unicode_script_tokenize(sentences):
        ragged = splitter.tokenize(sentences)
        if max_tokens is not None:
            ragged = ragged[:, :max_tokens]
        return ragged.to_tensor(default_value=""), tf.cast(ragged.row_lengths(), tf.int32)

    return unicode_script_tokenize


def _model_outputs(model, char_ids):
    out = model(char_ids, training=False)  # an empty batch works as is: the char CNN handles zero tokens
    result = {"word_emb": out["word_emb"]}
    for layer in range(1, model.config.num_layers + 1):
        result[f"lstm_outputs{layer}"] = out[f"lstm_outputs{layer}"]
    result.update(elmo=out[model.mixes[0]], default=out["default"], sequence_len=out["sequence_len"], mask=out["mask"])
    return result


def tokens_char_ids(tokens, sequence_len, max_tokens=None):
    """The `tokens` signature's input handling: `(batch, T)` strings + lengths -> char ids `(batch, T', 50)`.

    Tokens at or beyond `sequence_len` become padding whatever they hold; "" inside the length becomes a token
    without characters; `max_tokens` cuts every sentence. Lengths outside `[0, T]` or a batch size that
    differs from `tokens`' raise InvalidArgumentError (in the graph).
    """
    tokens = tf.convert_to_tensor(tokens, tf.string)
    sequence_len = tf.convert_to_tensor(sequence_len, tf.int32)
    width = tf.shape(tokens)[1]
    checks = [
        tf.debugging.assert_equal(
            tf.shape(sequence_len)[0], tf.shape(tokens)[0], message="sequence_len must have one entry per row of tokens"
        ),
        tf.debugging.assert_non_negative(sequence_len, message="sequence_len must be >= 0"),
        tf.debugging.assert_less_equal(
            sequence_len, width, message="sequence_len must be <= the width of tokens (axis 1)"
        ),
    ]
    with tf.control_dependencies(checks):
        tokens = tf.identity(tokens)
    if max_tokens is not None:
        tokens = tokens[:, :max_tokens]
        sequence_len = tf.minimum(sequence_len, max_tokens)
    inside = tf.sequence_mask(sequence_len, tf.shape(tokens)[1])
    tokens = tf.where(inside, tokens, "")
    char_ids = tokens_to_char_ids(tokens)
    empty = (inside & tf.equal(tokens, ""))[..., None]
    return tf.where(empty, tf.constant(_EMPTY_TOKEN_CHAR_IDS), char_ids)


def build_archive(model, tokenizer="whitespace", max_tokens=None):
    """A `keras.export.ExportArchive` with the `default`/`serving_default` and `tokens` endpoints."""
    _check_tokenizer(tokenizer)
    _check_max_tokens(max_tokens)
    if not model.mixes:
        raise ValueError("the model has no ScalarMix (mixes=()): the `elmo` and `default` outputs need one")
    tokenize = make_tokenizer(tokenizer, max_tokens)

    def default(sentences):
        tokens, _ = tokenize(sentences)
        return _model_outputs(model, tokens_to_char_ids(tokens))

    def tokens_fn(tokens, sequence_len):
        return _model_outputs(model, tokens_char_ids(tokens, sequence_len, max_tokens))

    archive = keras.export.ExportArchive()
    archive.track(model)
    # the first endpoint is also written as `serving_default` (the same function, traced once)
    archive.add_endpoint(
        SENTENCES_SIGNATURE, default, input_signature=[tf.TensorSpec([None], tf.string, name="sentences")]
    )
    archive.add_endpoint(
        TOKENS_SIGNATURE,
        tokens_fn,
        input_signature=[
            tf.TensorSpec([None, None], tf.string, name="tokens"),
            tf.TensorSpec([None], tf.int32, name="sequence_len"),
        ],
    )
    return archive


def existing_versions(base_dir):
    """The integer version directories under `base_dir`, sorted."""
    if not os.path.isdir(base_dir):
        return []
    return sorted(
        int(name)
        for name in os.listdir(base_dir)
        if re.fullmatch(r"[0-9]+", name) and os.path.isdir(os.path.join(base_dir, name))
    )


def next_version(base_dir):
    """1 for a new base directory, else the highest integer version + 1."""
    versions = existing_versions(base_dir)
    return versions[-1] + 1 if versions else 1


# ---------------------------------------------------------------------------------------------------- parity


def _pad(token_lists):
    width = max([len(t) for t in token_lists], default=0)
    tokens = np.array([[bytes(x) for x in t] + [b""] * (width - len(t)) for t in token_lists], dtype=object)
    return tokens.reshape(len(token_lists), width), np.array([len(t) for t in token_lists], np.int32)


def reference_tokens(sentences, tokenizer="whitespace", max_tokens=None):
    """Python-side tokenization of `sentences` (list of str/bytes): a list of token lists (bytes)."""
    sentences = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    if tokenizer == "whitespace":
        lists = [s.split() for s in sentences]  # bytes.split(): runs of ASCII whitespace, as tf.strings.split
    else:
        tokens, lengths = make_tokenizer(tokenizer)(tf.constant(sentences, tf.string))
        lists = [list(row[:n]) for row, n in zip(tokens.numpy(), lengths.numpy())]
    return [t[:max_tokens] if max_tokens else t for t in lists]


def reference_outputs(model, token_lists):
    """The Keras model's outputs (NumPy) for a list of token lists, keyed like the signatures' outputs."""
    tokens, _ = _pad(token_lists)
    out = _model_outputs(model, tokens_to_char_ids(tf.constant(tokens, tf.string)))
    return {key: np.asarray(value) for key, value in out.items()}


def compare_outputs(expected, actual):
    """Max |difference| per output key (float) or count of mismatches (int/bool); raises on missing keys/shapes."""
    if sorted(expected) != sorted(actual):
        raise ExportError(f"output keys differ: expected {sorted(expected)}, got {sorted(actual)}")
    diffs = {}
    for key in expected:
        a, b = np.asarray(expected[key]), np.asarray(actual[key])
        if a.shape != b.shape:
            raise ExportError(f"output {key!r}: shape {b.shape}, expected {a.shape}")
        if a.dtype.kind == "f":
            diffs[key] = float(np.max(np.abs(a - b))) if a.size else 0.0
        else:
            diffs[key] = float(np.sum(a != b))
    return diffs


def check_export(
    model, export_dir, tokenizer="whitespace", max_tokens=None, sentences=CHECK_SENTENCES, atol=PARITY_ATOL
):
    """Reloads `export_dir` with `tf.saved_model.load` and compares every signature with the Keras model.

    The `tokens` signature also gets junk beyond each `sequence_len`, which must not change anything.
    Returns `{signature: {output: max |diff|}}`; raises `ExportError` when a difference exceeds `atol`
    (any difference for int/bool outputs).
    """
    loaded = tf.saved_model.load(export_dir)
    missing = [name for name in SIGNATURES if name not in loaded.signatures]
    if missing:
        raise ExportError(f"{export_dir}: signatures {missing} missing (found {sorted(loaded.signatures)})")
    token_lists = reference_tokens(sentences, tokenizer, max_tokens)
    expected = reference_outputs(model, token_lists)
    tokens, lengths = _pad(token_lists)
    junk = np.where(tokens == b"", b"junk", tokens)  # beyond sequence_len: ignored
    results = {}
    for name in (SENTENCES_SIGNATURE, SERVING_DEFAULT):
        out = loaded.signatures[name](
            sentences=tf.constant([s.encode("utf-8") if isinstance(s, str) else s for s in sentences], tf.string)
        )
        results[name] = compare_outputs(expected, {k: v.numpy() for k, v in out.items()})
    out = loaded.signatures[TOKENS_SIGNATURE](tokens=tf.constant(junk, tf.string), sequence_len=tf.constant(lengths))
    results[TOKENS_SIGNATURE] = compare_outputs(expected, {k: v.numpy() for k, v in out.items()})
    bad = {
        f"{sig}/{key}": diff
        for sig, diffs in results.items()
        for key, diff in diffs.items()
        if diff > (atol if np.asarray(expected[key]).dtype.kind == "f" else 0)
    }
    if bad:
        raise ExportError(f"{export_dir}: reloaded outputs differ from the Keras model's (atol {atol}): {bad}")
    return results


# ---------------------------------------------------------------------------------------------------- export


def export_elmo(
    model, base_dir, version=None, tokenizer="whitespace", max_tokens=None, check=True, check_sentences=CHECK_SENTENCES
):
    """Writes `model` as `<base_dir>/<version>/`, a SavedModel with the serving signatures; returns its path.

    Args:
        model: an `elmo_tf.ELMo` (with at least one mix; the first is exported as `elmo`).
        base_dir: the model's base path (the directory TF Serving polls), created when missing.
        version: positive int; default: the highest existing version + 1 (1 for a new base_dir).
        tokenizer: "whitespace" or "unicode_script" (tensorflow-text; see the module docstring).
        max_tokens: optional int; both signatures cut sentences to their first `max_tokens` tokens.
        check: reload the written SavedModel and compare it with the Keras model before publishing it.
        check_sentences: sentences for that check.
    Returns:
        the path of the new version directory.
    Raises:
        FileExistsError: the version exists (versions are never overwritten).
        ExportError: the check failed; nothing is published.
    """
    _check_tokenizer(tokenizer)
    _check_max_tokens(max_tokens)

    def write(tmp):
        logger.info("tracing signatures (tokenizer %s, max_tokens %s)", tokenizer, max_tokens)
        archive = build_archive(model, tokenizer, max_tokens)
        logger.info("writing %s", tmp)
        archive.write_out(tmp, verbose=False)
        if check:
            logger.info("checking the reloaded SavedModel against the Keras model")
            results = check_export(model, tmp, tokenizer, max_tokens, check_sentences)
            worst = max(d for diffs in results.values() for d in diffs.values())
            logger.info("parity ok: max |diff| %.3g over signatures %s", worst, sorted(results))

    return publish_version(base_dir, version, write)


def publish_version(base_dir, version, write):
    """Creates `<base_dir>/<version>/` atomically: `write(tmp_dir)` fills a hidden temporary directory
    (and may check it), which is renamed into place only when `write` returns. Returns the final path.

    Raises:
        FileExistsError: the version exists (versions are never overwritten).
    """
    base_dir = os.path.abspath(base_dir)
    os.makedirs(base_dir, exist_ok=True)
    if version is None:
        version = next_version(base_dir)
    elif isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive int, got {version!r}")
    final = os.path.join(base_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"version {version} already exists at {final}; versions are never overwritten")
    # hidden, non-numeric name: TF Serving only considers integer directory names
    tmp = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=base_dir)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the version from a server running as another user
        write(tmp)
        if os.path.exists(final):
            raise FileExistsError(f"version {version} appeared at {final} during the export; not overwritten")
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("published %s", final)
    return final


# ---------------------------------------------------------------------------------------------------- CLI

EXAMPLES = """examples:
  python export/export_savedmodel.py --options options.json --weights weights.hdf5 --output models/elmo
  python export/export_savedmodel.py --model-dir runs/pretrain --output models/elmo --version 3
  python export/export_savedmodel.py --options options.json --weights weights.hdf5 --output models/elmo \\
      --tokenizer unicode_script --max-tokens 400

writes OUTPUT/<version>/ (next integer by default; an existing version is an error), the layout TF Serving
polls: tensorflow_model_server --model_name=elmo --model_base_path=$PWD/models/elmo

signatures: default and serving_default (sentences: tf.string [B]), tokens (tokens: tf.string [B,T] padded
with "", sequence_len: int32 [B]; tokens beyond sequence_len are ignored).
outputs: word_emb, lstm_outputs1..L, elmo, default (mean over real tokens), sequence_len, mask (bool).

--tokenizer unicode_script needs tensorflow-text where the model is loaded: `import tensorflow_text` before
tf.saved_model.load in a fresh Python process; C++ loaders load its op library
(tensorflow_text/python/ops/_unicode_script_tokenizer.so) with TF_LoadLibrary. The stock model server has
these ops built in. --tokenizer whitespace (the default) needs core TensorFlow only.

--max-tokens N: both signatures keep each sentence's first N tokens (outputs have at most N positions), a
guard against very long requests.

check it with TF Serving's own C++ loader (tensorflow::LoadSavedModel + Session::Run, every signature):
  $(bash export/cpp/build.sh) --export_dir models/elmo/1 --sentence "a b c"
  (add --op_library .../tensorflow_text/python/ops/_unicode_script_tokenizer.so for a unicode_script export)

after writing, the SavedModel is reloaded and compared with the Keras model (max |diff| <= 1e-5) before
the version is published; the exit status is non-zero if anything fails.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, naming the argument
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv=None):
    parser = _Parser(
        prog="export_savedmodel.py",
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--options", help="bilm-tf options.json (with --weights)")
    parser.add_argument("--weights", help="bilm-tf/AllenNLP weights.hdf5 (with --options)")
    parser.add_argument(
        "--model-dir",
        help="a directory holding options.json and weights.hdf5 (a pretraining "
        "output directory), instead of --options/--weights",
    )
    parser.add_argument("--output", required=True, help="base path of the model: versions go to OUTPUT/<version>/")
    parser.add_argument("--version", type=positive_int("--version"), help="version number (default: next integer)")
    parser.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default="whitespace",
        help="in-graph tokenizer of the default signature (default: whitespace)",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int("--max-tokens"),
        help="cut every sentence to its first N tokens, in both signatures",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the reload-and-compare check (not advised)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    if args.model_dir:
        if args.options or args.weights:
            parser.error("argument --model-dir: not allowed with --options/--weights")
        if not os.path.isdir(args.model_dir):
            parser.error(f"argument --model-dir: not a directory: {args.model_dir!r}")
        args.options = os.path.join(args.model_dir, "options.json")
        args.weights = os.path.join(args.model_dir, "weights.hdf5")
        for flag, path in (("--model-dir", args.options), ("--model-dir", args.weights)):
            if not os.path.isfile(path):
                parser.error(f"argument {flag}: {args.model_dir!r} has no {os.path.basename(path)}")
    else:
        if not args.options:
            parser.error("argument --options: required (or pass --model-dir)")
        if not args.weights:
            parser.error("argument --weights: required with --options (or pass --model-dir)")
        for flag, path in (("--options", args.options), ("--weights", args.weights)):
            if not os.path.isfile(path):
                parser.error(f"argument {flag}: no such file: {path!r}")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        parser.error(f"argument --output: exists and is not a directory: {args.output!r}")
    if args.version is not None and os.path.exists(os.path.join(args.output, str(args.version))):
        parser.error(
            f"argument --version: version {args.version} already exists at "
            f"{os.path.join(args.output, str(args.version))}; versions are never overwritten"
        )
    if args.tokenizer == "unicode_script":
        try:
            import tensorflow_text  # noqa: F401
        except ImportError as e:
            parser.error(f"argument --tokenizer: unicode_script needs tensorflow-text ({e})")
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from elmo_tf.io.bilm_hdf5 import WeightFileError, load_elmo

    try:
        logger.info("loading %s + %s", args.options, args.weights)
        model = load_elmo(args.options, args.weights)
    except (ValueError, WeightFileError) as e:
        logger.error("cannot load the model: %s", e)
        return 1
    try:
        path = export_elmo(
            model,
            args.output,
            version=args.version,
            tokenizer=args.tokenizer,
            max_tokens=args.max_tokens,
            check=not args.no_check,
        )
    except FileExistsError as e:
        logger.error("--version: %s", e)
        return 1
    except (ExportError, OSError) as e:
        logger.error("export failed: %s", e)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
