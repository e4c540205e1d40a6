"""Serves SavedModel exports over TF Serving's gRPC and REST APIs: the stock model server when installed, else the
embedded one. A thin command line over `elmo_tf.cli.serve.main` (flags, hand-over and exit statuses are documented
there; `python serving/serve.py --help` lists them).

    python serving/serve.py --model_base_path models/elmo --model_name elmo --port 8500 [--rest_api_port 8501]
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from elmo_tf.cli import run  # noqa: E402
from elmo_tf.cli.serve import PROG, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main, prog=PROG))
