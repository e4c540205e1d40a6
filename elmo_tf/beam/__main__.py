"""`python -m elmo_tf.beam ...`: the same command as `elmo-tf beam-embed ...`."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.beam_embed import main  # noqa: E402

if __name__ == "__main__":
    prog = "python -m elmo_tf.beam"
    sys.exit(run(lambda argv: main(argv, prog=prog), sys.argv[1:], prog=prog))
