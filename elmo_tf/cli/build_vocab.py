"""Builds a biLM vocabulary: `<S>`, `</S>`, `<UNK>`, then words by decreasing frequency.

examples:
  python training/build_vocab.py --train 'corpus/*.txt' --output vocab.txt --min-count 3
  python training/build_vocab.py --train ../shared/data/ptb/ptb.train.txt --output ptb_vocab.txt --max-size 10003

The corpus is streamed line by line (only the word counts are held in memory). Tokens are whitespace
separated; the files are UTF-8 (a byte order mark is skipped) and invalid UTF-8 is replaced by U+FFFD when
counting, with a warning naming the first such line. A UTF-16 or binary file is an error (exit 1), as is a
corpus without a word. The output is written whole or not at all (a temporary file renamed at the end).
"""

import argparse
import logging
import sys
import time

from elmo_tf.bounds import INT32_MAX
from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    bounded_number,
    check_output_file,
    count_int,
    glob_flag,
    setup_logging,
)
from elmo_tf.io.atomic import WriteError
from elmo_tf.io.vocabulary import SPECIALS, CorpusError, build_vocabulary, count_words

PROG = "build_vocab.py"


def build_parser(prog=PROG):
    parser = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="glob of training text files (quote it)")
    parser.add_argument("--output", required=True, help="vocabulary file to write")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--min-count", type=count_int("--min-count", minimum=1), default=1, help="keep words seen at least N times (1)"
    )
    group.add_argument(
        "--max-size",
        type=bounded_number("--max-size", int, minimum=len(SPECIALS), minimum_inclusive=False, maximum=INT32_MAX),
        default=None,
        help=f"keep the N most frequent entries, the {len(SPECIALS)} specials included",
    )
    return parser


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    files = glob_flag("--train", args.train)
    check_output_file("--output", args.output, inputs=[("--train", path) for path in files])
    from tqdm import tqdm

    setup_logging()
    start = time.perf_counter()
    try:
        with tqdm(unit="lines", file=sys.stderr, desc="counting", delay=1.0) as bar:  # quiet when quick
            counts = count_words(files, progress=bar.update)
    except CorpusError as e:
        raise DataError(f"--train: {e}") from None
    if not counts:
        raise DataError(f"--train: no words in the {len(files)} file(s) matching {args.train!r}")
    vocab = build_vocabulary(counts, min_count=args.min_count, max_size=args.max_size)
    try:
        vocab.save(args.output)
    except WriteError as e:  # a full disk: the temporary is removed, an existing output kept
        raise DataError(f"--output: {e}") from None
    total = sum(counts.values())
    covered = sum(counts.get(w, 0) for w in vocab.words)
    logging.info(
        "%d files, %d tokens, %d types -> %d entries (%.2f%% of tokens covered) in %.1f s: %s",
        len(files),
        total,
        len(counts),
        len(vocab),
        100.0 * covered / max(total, 1),
        time.perf_counter() - start,
        args.output,
    )
    return 0
