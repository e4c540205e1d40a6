"""Natural-English benchmark sentences, read (never copied into the project) from the shared data folder.

The default corpus is `../shared/data/pretrain/gmb_news_sentences.txt` relative to the repository root
(Groningen Meaning Bank news, one tokenized sentence per line). Empty lines are skipped and the first
`n` lines of at least one token are kept, in corpus order. Whitespace is normalized to single ASCII
spaces, so `str.split()` (AllenNLP's peer script) and a split on ASCII whitespace bytes (`elmo_tf embed`)
give the same tokens.

usage: python bench/sentences.py [--n 1000] [--data PATH] --output sentences.txt
"""

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "pretrain", "gmb_news_sentences.txt"))


def load_sentences(n=1000, data=None):
    """The first `n` non-empty lines of `data` (default: the GMB news sentences), whitespace-normalized.

    Raises:
        FileNotFoundError: `data` does not exist.
        ValueError: `n` < 1, or the file holds fewer than `n` non-empty lines.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    data = data or DEFAULT_DATA
    if not os.path.isfile(data):
        raise FileNotFoundError(f"sentence file not found: {data!r} (pass --data)")
    sentences = []
    with open(data, encoding="utf-8", errors="replace") as f:
        for line in f:
            tokens = line.split()
            if tokens:
                sentences.append(" ".join(tokens))
                if len(sentences) == n:
                    return sentences
    raise ValueError(f"{data!r} has only {len(sentences)} non-empty lines, {n} requested")


def write_sentences(sentences, path=None):
    """Writes one sentence per line (UTF-8, no empty lines) to `path`, or to a new temporary file.
    Returns the path."""
    if path is None:
        fd, path = tempfile.mkstemp(prefix="elmo_bench_", suffix=".txt")
        os.close(fd)
    with open(path, "w", encoding="utf-8") as f:
        for sentence in sentences:
            f.write(sentence + "\n")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="number of sentences (1000)")
    parser.add_argument("--data", default=None, help=f"corpus, one sentence per line (default {DEFAULT_DATA})")
    parser.add_argument("--output", required=True, help="text file to write")
    args = parser.parse_args(argv)
    try:
        sentences = load_sentences(args.n, args.data)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_sentences(sentences, args.output)
    print(
        f"{len(sentences)} sentences, {sum(len(s.split()) for s in sentences)} tokens -> {args.output}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
