"""Builds a biLM vocabulary.
A thin command line over `elmo_tf.cli.build_vocab.main` (flags, errors and exit statuses are documented
there; `python training/build_vocab.py --help` lists them); the same as `elmo-tf build-vocab`.

    python training/build_vocab.py --train 'corpus/*.txt' --output vocab.txt --min-count 3
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.build_vocab import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
