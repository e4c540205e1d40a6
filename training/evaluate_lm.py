"""Full-softmax perplexity of a pretrained biLM as JSON.
A thin command line over `elmo_tf.cli.evaluate_lm.main` (flags, errors and exit statuses are documented
there; `python training/evaluate_lm.py --help` lists them); the same as `elmo-tf evaluate-lm`.

    python training/evaluate_lm.py --model runs/small --test heldout.txt
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.evaluate_lm import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
