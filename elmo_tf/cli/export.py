"""Exports an ELMo model as a versioned SavedModel for TF Serving: `<base>/<version>/` (README, "Export").

A thin command line over `elmo_tf.saved_model.export.export_elmo`; the signatures are `elmo_tf.saved_model.contract`'s.
"""

import argparse
import logging
import os

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    bounded_number,
    check_output_dir,
    count_int,
    setup_logging,
    size_int,
)
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision
from elmo_tf.preprocessing.tokenizer import TOKENIZERS

PROG = "export_savedmodel.py"

logger = logging.getLogger("export_savedmodel")

MAX_LM_TOP_K = 1000

EXAMPLES = """examples:
  python export/export_savedmodel.py --options options.json --weights weights.hdf5 --output models/elmo
  python export/export_savedmodel.py --model-dir runs/pretrain --output models/elmo --version 3
  python export/export_savedmodel.py --options options.json --weights weights.hdf5 --output models/elmo \\
      --tokenizer unicode_script --max-tokens 400
  python export/export_savedmodel.py --model-dir runs/pretrain --output models/elmo_bf16 --precision bfloat16

writes OUTPUT/<version>/ (an existing version is an error), the layout TF Serving polls:
  tensorflow_model_server --model_name=elmo --model_base_path=$PWD/models/elmo
without --version, the next free integer when the export is published: exports started at once into one OUTPUT
each get their own version.

signatures: default and serving_default (sentences: tf.string [B]), tokens (tokens: tf.string [B,T] padded
with "", sequence_len: int32 [B]; tokens beyond sequence_len are ignored).
outputs: word_emb, lstm_outputs1..L, elmo, default (mean over real tokens), sequence_len, mask (bool).
with a softmax and its vocabulary (--softmax/--vocab, or softmax.hdf5 + vocab.txt in --model-dir), also lm
(inputs as tokens): forward_log_probs, backward_log_probs [B,T+1] (0 past a row's n + 1), and with --lm-top-k K
forward_top_k_words, forward_top_k_log_probs, backward_top_k_words, backward_top_k_log_probs [B,T+1,K].

--tokenizer unicode_script needs tensorflow-text where the model is loaded: `import tensorflow_text` before
tf.saved_model.load in a fresh Python process; C++ loaders load its op library
(tensorflow_text/python/ops/_unicode_script_tokenizer.so) with TF_LoadLibrary. The stock model server has
these ops built in. --tokenizer whitespace (the default) needs core TensorFlow only.

--max-tokens N: both signatures keep each sentence's first N tokens (outputs have at most N positions), a
guard against very long requests.

--precision bfloat16: the export computes in bfloat16 (the matmuls' operands; float32 accumulation, state and
outputs: every output stays float32), on bfloat16 copies of the weights held in the SavedModel: stock TF Serving and
the C++ loader run it as it is, on any CPU (fast with AVX512_BF16 or AMX, emulated elsewhere). auto: bfloat16 where
the exporting CPU multiplies it natively. The version's assets.extra/elmo_tf.json records the precision.

check it with TF Serving's own C++ loader (tensorflow::LoadSavedModel + Session::Run, every signature):
  $(bash export/cpp/build.sh) --export_dir models/elmo/1 --sentence "a b c"
  (add --op_library .../tensorflow_text/python/ops/_unicode_script_tokenizer.so for a unicode_script export)

after writing, the SavedModel is reloaded and compared with the Keras model (max |diff| <= 1e-5) before
the version is published. Exit status: 0 done, 2 bad command line, 1 bad model files or a failed export.
An interrupted export publishes nothing; its temporary directory is removed (the next export removes those
of a killed one).
"""


def add_export_flags(parser, output_help):
    """The flags of a versioned SavedModel export, shared by `export` and `export-tagger`: --output (its help:
    `output_help`), --version (1 to int64's largest: TF Serving reads a version directory's name as an int64),
    --tokenizer, --max-tokens (int32: sequence lengths are int32, a larger cap cuts nothing)."""
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument(
        "--version",
        type=count_int("--version", minimum=1),
        help="version number, 1 to 2**63 - 1 (default: the next free integer when the export is published)",
    )
    parser.add_argument(
        "--tokenizer", choices=TOKENIZERS, default="whitespace", help="in-graph tokenizer of the default signature"
    )
    parser.add_argument("--max-tokens", type=size_int("--max-tokens"), help="cut every sentence to its first N tokens")


def check_export_flags(args):
    """Raises UsageError unless the flags of `add_export_flags` can work: --output can be created, --version is not
    there yet (versions are never overwritten), tensorflow-text is installed for --tokenizer unicode_script."""
    check_output_dir("--output", args.output)
    if args.version is not None and os.path.exists(os.path.join(args.output, str(args.version))):
        raise UsageError(
            f"--version: version {args.version} already exists in {args.output!r}; versions are never overwritten"
        )
    if args.tokenizer == "unicode_script":
        try:
            import tensorflow_text  # noqa: F401
        except ImportError as e:
            raise UsageError(f"--tokenizer: unicode_script needs tensorflow-text ({e})") from None


def parse_args(argv=None, prog=PROG):
    parser = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--options", help="bilm-tf options.json (with --weights)")
    parser.add_argument("--weights", help="bilm-tf/AllenNLP weights.hdf5 (with --options)")
    parser.add_argument(
        "--model-dir",
        metavar="DIR|NAME|URL",
        help="a directory holding options.json and weights.hdf5 (a pretraining output directory), "
        "instead of --options/--weights; or a released model's name or URL (`elmo-tf models`), downloaded once "
        "into the cache",
    )
    add_export_flags(parser, output_help="base path of the model: versions go to OUTPUT/<version>/")
    add_precision_flag(parser, what=": what the export computes in, recorded in assets.extra/elmo_tf.json")
    parser.add_argument("--softmax", help="softmax hdf5 of the biLM (softmax/W, softmax/b): adds the lm signature")
    parser.add_argument("--vocab", help="the softmax's vocabulary, one word per line (with --softmax)")
    parser.add_argument(
        "--lm-top-k",
        type=bounded_number("--lm-top-k", int, minimum=0, maximum=MAX_LM_TOP_K),
        default=0,
        help=f"the lm signature also returns the K most likely words per position (0 to {MAX_LM_TOP_K}; 0: none)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the reload-and-compare check (not advised)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args):
    """Everything about the command line that can be checked before the model is loaded; raises UsageError."""
    if args.model_dir:
        if args.options or args.weights:
            raise UsageError("--model-dir: not allowed with --options/--weights")
        from elmo_tf.cli.models import resolve_model
        from elmo_tf.presets import is_preset

        if is_preset(args.model_dir):
            args.model_dir = os.path.dirname(resolve_model("--model-dir", args.model_dir)["weights"])
        if not os.path.isdir(args.model_dir):
            raise UsageError(f"--model-dir: not a directory: {args.model_dir!r}")
        args.options = os.path.join(args.model_dir, "options.json")
        args.weights = os.path.join(args.model_dir, "weights.hdf5")
        for path in (args.options, args.weights):
            if not os.path.isfile(path):
                raise UsageError(f"--model-dir: {args.model_dir!r} has no {os.path.basename(path)}")
    else:
        if not args.options:
            raise UsageError("--options: required (or pass --model-dir)")
        if not args.weights:
            raise UsageError("--weights: required with --options (or pass --model-dir)")
        for flag, path in (("--options", args.options), ("--weights", args.weights)):
            if not os.path.isfile(path):
                raise UsageError(f"{flag}: no such file: {path!r}")
    check_lm_args(args)
    check_export_flags(args)


def check_lm_args(args):
    """--softmax and --vocab go together (--model-dir gives both when it holds softmax.hdf5 and vocab.txt and
    neither is given); --lm-top-k needs them. Raises UsageError."""
    if args.model_dir and not args.softmax and not args.vocab:
        softmax, vocab = (os.path.join(args.model_dir, name) for name in ("softmax.hdf5", "vocab.txt"))
        if os.path.isfile(softmax) and os.path.isfile(vocab):
            args.softmax, args.vocab = softmax, vocab
    if bool(args.softmax) != bool(args.vocab):
        given, missing = ("--softmax", "--vocab") if args.softmax else ("--vocab", "--softmax")
        raise UsageError(f"{given} needs {missing} (the softmax's rows follow the vocabulary's lines)")
    for flag, path in (("--softmax", args.softmax), ("--vocab", args.vocab)):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag}: no such file: {path!r}")
    if args.lm_top_k and not args.softmax:
        raise UsageError("--lm-top-k: needs --softmax and --vocab (the lm signature)")


def load_lm(args, model):
    """The `LanguageModel` of --softmax/--vocab over `model`'s biLM, or None; DataError naming the file."""
    if not args.softmax:
        return None
    from elmo_tf.io import WeightFileError
    from elmo_tf.io.softmax import LMVocabularyError
    from elmo_tf.models import load_language_model

    logger.info("loading the language model: %s + %s", args.softmax, args.vocab)
    try:
        return load_language_model(None, None, args.softmax, args.vocab, elmo=model, top_k=args.lm_top_k)
    except LMVocabularyError as e:
        raise DataError(f"--vocab: {e}") from None
    except WeightFileError as e:
        raise DataError(f"--softmax: {e}") from None
    except ValueError as e:  # --lm-top-k above the vocabulary's size
        raise UsageError(f"--lm-top-k: {e}") from None


def main(argv=None, prog=PROG):
    args = parse_args(argv, prog)
    setup_logging(verbose=args.verbose, fmt="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from elmo_tf.models import load_elmo
    from elmo_tf.saved_model.export import export_elmo
    from elmo_tf.saved_model.versions import ExportError

    precision = resolved_precision(args.precision)
    shown = precision_text(precision, args.precision)
    logger.info("loading %s + %s to compute in %s", args.options, args.weights, shown)
    try:
        model = load_elmo(args.options, args.weights, precision=precision)
    except (ValueError, OSError) as e:  # ConfigError / WeightFileError are ValueErrors naming the file
        raise DataError(f"--options/--weights: cannot load the model: {e}") from None
    lm = load_lm(args, model)
    try:
        path = export_elmo(
            model,
            args.output,
            version=args.version,
            tokenizer=args.tokenizer,
            max_tokens=args.max_tokens,
            check=not args.no_check,
            lm=lm,
        )
    except FileExistsError as e:
        raise UsageError(f"--version: {e}") from None
    except (ExportError, OSError) as e:
        raise DataError(f"--output: export failed: {e}") from None
    print(path)
    return 0
