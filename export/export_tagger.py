"""Exports the NER tagger with its frozen ELMo as one SavedModel.
A thin command line over `elmo_tf.cli.export_tagger.main` (flags, errors and exit statuses are documented
there; `python export/export_tagger.py --help` lists them); the same as `elmo-tf export-tagger`.

    python export/export_tagger.py --ner runs/ner --elmo runs/small --output models/tagger
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.export_tagger import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
