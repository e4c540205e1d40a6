"""Pretrains an ELMo biLM on text.
A thin command line over `elmo_tf.cli.pretrain.main` (flags, errors and exit statuses are documented
there; `python training/pretrain.py --help` lists them); the same as `elmo-tf pretrain`.

    python training/pretrain.py --train 'corpus/*.txt' --vocab vocab.txt --config small --output runs/small --steps 2000
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.pretrain import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
