"""elmo_tf/serving/options.py: `ServerOptions` imports neither TensorFlow nor gRPC (the command line reads its fields
before either loads), and its request limits are `Limits`' defaults."""

import subprocess
import sys


def test_importing_the_options_loads_neither_tensorflow_nor_grpc():
    code = "import sys, elmo_tf.serving.options; print(sorted({'tensorflow', 'grpc', 'numpy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_default_request_limits_are_the_budgets():
    from elmo_tf.serving.limits.budget import Limits
    from elmo_tf.serving.options import ServerOptions

    assert ServerOptions().limits == Limits()
