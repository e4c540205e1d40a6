"""Exports an ELMo model as a versioned SavedModel for TF Serving.
A thin command line over `elmo_tf.cli.export.main` (flags, errors and exit statuses are documented
there; `python export/export_savedmodel.py --help` lists them); the same as `elmo-tf export`.

    python export/export_savedmodel.py --model-dir runs/small --output models/elmo
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.export import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
