"""Full-softmax perplexity of a pretrained biLM (forward, backward, average) as JSON.

examples:
  python training/evaluate_lm.py --model runs/small --test ../shared/data/ptb/ptb.test.txt
  python training/evaluate_lm.py --model runs/small --test heldout.txt --output ppl.json

--model is a training/pretrain.py output dir (options.json, weights.hdf5, softmax.hdf5, vocab.txt).
Targets: every word plus </S> (forward) / <S> (backward); lines longer than --max-tokens are cut into
pieces, as in training. The log-probabilities are those `elmo-tf score` writes per token (one code path:
elmo_tf.models.language_model), so exp(-mean) of score's forward_log_probs over the same lines is this
perplexity. --test is text, one sentence per line (bytes kept as they are; an empty, blank, UTF-16 or binary file
is an error). The JSON goes to stdout and, with --output, to a file written whole or not at all.
"""

import argparse
import json
import os
import sys

from elmo_tf.bounds import BATCH_SIZE, TOKENS
from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    check_output_file,
    check_text_file,
    existing_dir,
    existing_file,
    number_type,
    setup_logging,
)

PROG = "evaluate_lm.py"

MODEL_FILES = ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt")


def build_parser(prog=PROG):
    parser = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=existing_dir("--model"), help="pretraining output dir")
    parser.add_argument("--test", required=True, type=existing_file("--test"), help="text file")
    parser.add_argument(
        "--batch-size", type=number_type("--batch-size", BATCH_SIZE), default=64, help="sentences per batch (64)"
    )
    parser.add_argument(
        "--max-tokens", type=number_type("--max-tokens", TOKENS), default=50, help="cut longer lines into pieces (50)"
    )
    parser.add_argument("--output", default=None, help="also write the JSON here")
    return parser


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    model_files = {name: os.path.join(args.model, name) for name in MODEL_FILES}
    for name, path in model_files.items():
        if not os.path.isfile(path):
            raise UsageError(f"--model: {args.model!r} has no {name} (expected a training/pretrain.py output dir)")
    if args.output:
        inputs = [("--test", args.test)] + [("--model", path) for path in model_files.values()]
        check_output_file("--output", args.output, inputs=inputs)
    check_text_file("--test", args.test, require_tokens=True)
    setup_logging()
    from tqdm import tqdm

    from elmo_tf.io.atomic import WriteError, stdout_write_error, write_text
    from elmo_tf.io.bilm_hdf5 import open_hdf5
    from elmo_tf.pretraining import evaluate_perplexity, load_model_dir

    try:
        open_hdf5(model_files["softmax.hdf5"], what="softmax file").close()  # load_model_dir does not check this
        model, vocab = load_model_dir(args.model)
    except ValueError as e:  # ConfigError, WeightFileError, VocabularyError, a softmax that does not fit
        raise DataError(f"--model: {e}") from None
    with tqdm(unit="sent", file=sys.stderr, desc="evaluate") as bar:
        result = evaluate_perplexity(
            model, vocab, [args.test], batch_size=args.batch_size, max_tokens=args.max_tokens, progress=bar.update
        )
    result.update(model=args.model, test=args.test)
    text = json.dumps(result, indent=2)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `| head`: elmo_tf.cli.run ends quietly
        raise
    except OSError as e:  # `> file` on a full disk
        raise DataError(f"stdout: {stdout_write_error(e)}") from None
    if args.output:
        try:
            write_text(args.output, text + "\n")
        except WriteError as e:  # a full disk: the temporary is removed, an existing output kept
            raise DataError(f"--output: {e}") from None
    return 0
