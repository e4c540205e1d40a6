"""`python -m elmo_tf COMMAND ...`: the `elmo-tf` command (`elmo_tf.cli.main`) under this name."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="python -m elmo_tf"))
