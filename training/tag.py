"""Tags sentences with a trained NER tagger.
A thin command line over `elmo_tf.cli.tag.main` (flags, errors and exit statuses are documented
there; `python training/tag.py --help` lists them); the same as `elmo-tf tag`.

    python training/tag.py --help
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.tag import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
