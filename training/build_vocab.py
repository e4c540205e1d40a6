"""Builds a biLM vocabulary: `<S>`, `</S>`, `<UNK>`, then words by decreasing frequency.

examples:
  python training/build_vocab.py --train 'corpus/*.txt' --output vocab.txt --min-count 3
  python training/build_vocab.py --train ../shared/data/ptb/ptb.train.txt --output ptb_vocab.txt --max-size 10003

The corpus is streamed line by line (only the word counts are held in memory). Tokens are whitespace
separated; invalid UTF-8 is replaced by U+FFFD when counting.
"""

import argparse
import logging
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="glob of training text files (quote it)")
    parser.add_argument("--output", required=True, help="vocabulary file to write")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--min-count", type=int, default=1, help="keep words seen at least N times (1)")
    group.add_argument("--max-size", type=int, default=None, help="keep the N most frequent entries, specials included")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    from tqdm import tqdm

    from elmo_tf.io.vocabulary import build_vocabulary, count_words, expand_glob

    try:
        files = expand_glob(args.train)
        if args.min_count < 1:
            raise ValueError(f"--min-count must be >= 1, got {args.min_count}")
        if args.max_size is not None and args.max_size <= 3:
            raise ValueError(f"--max-size must be > 3 (the special tokens), got {args.max_size}")
    except ValueError as e:
        parser.error(f"--train/--min-count/--max-size: {e}")
    start = time.perf_counter()
    with tqdm(unit="lines", file=sys.stderr, desc="counting") as bar:
        counts = count_words(files, progress=bar.update)
    vocab = build_vocabulary(counts, min_count=args.min_count, max_size=args.max_size)
    vocab.save(args.output)
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


if __name__ == "__main__":
    sys.exit(main())
