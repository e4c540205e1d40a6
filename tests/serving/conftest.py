"""Fixtures of the serving tests: a small random ELMo exported with `export_elmo`, a shared embedded server on
127.0.0.1 (gRPC + REST on free ports), clients, the REST tests' `strict` server, and the model loaded without a
server. Helpers live in serving_testlib.py, rest_testlib.py and serving_fake.py.
"""

import os
import shutil
import textwrap

import pytest
from rest_testlib import SMALL_LIMIT, TIMEOUT_S
from serving_testlib import VALID, ex, make_model, reference_sentences, start_server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def model():
    return make_model(0)


@pytest.fixture(scope="session")
def base_path(model, tmp_path_factory):
    """`<tmp>/elmo` with version 1 of `model` (the shared server's base path; never written to by tests)."""
    base = tmp_path_factory.mktemp("serving") / "elmo"
    ex.export_elmo(model, str(base))
    return str(base)


@pytest.fixture(scope="session")
def server(base_path):
    """The shared embedded server (default options: batching on, limits 256 sentences / 1000 tokens / 256 MiB)."""
    server = start_server(base_path)
    yield server
    server.stop(grace=1.0)


@pytest.fixture
def client(server):
    from elmo_tf.serving.client import ElmoClient

    with ElmoClient(f"127.0.0.1:{server.grpc_port}", model_name="elmo", timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def expected(model):
    """The Keras model's outputs for `VALID`, the request every hostile case ends with."""
    return reference_sentences(model, VALID)


@pytest.fixture(scope="session")
def loaded(base_path):
    """Version 1 of `model` loaded in this process (a `servable.Servable`), without a server."""
    from elmo_tf.serving.servable import load_servable

    return load_servable("elmo", 1, os.path.join(base_path, "1"))


@pytest.fixture(scope="module")
def strict(base_path):
    """A server with a 3 s REST request deadline and a 4 MiB message limit, batching off (see rest_testlib)."""
    server = start_server(
        base_path, rest_api_timeout_in_ms=int(TIMEOUT_S * 1000), max_message_bytes=SMALL_LIMIT, enable_batching=False
    )
    yield server
    server.stop(grace=1.0)


@pytest.fixture
def rest_url(server):
    return f"http://127.0.0.1:{server.rest_port}"


@pytest.fixture
def fresh_base(base_path, tmp_path):
    """A copy of the shared base path (version 1 of `model`) that the test may change."""
    base = tmp_path / "elmo"
    shutil.copytree(base_path, base)
    return str(base)


@pytest.fixture
def fake_stock_server(tmp_path):
    """A `tensorflow_model_server` on PATH that writes its argv (one per line) to $RECORD and exits 3:
    (the fake binary, the record file, the environment to run serve.py with)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "tensorflow_model_server"
    fake.write_text(
        textwrap.dedent("""\
        #!/bin/sh
        printf '%s\\n' "$0" "$@" > "$RECORD"
        exit 3
    """)
    )
    fake.chmod(0o755)
    record = tmp_path / "argv.txt"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "RECORD": str(record)}
    return fake, record, env
