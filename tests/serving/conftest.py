"""Fixtures of the serving tests: a small random ELMo exported with `export_elmo`, a shared embedded server on
127.0.0.1 (gRPC + REST on free ports) and clients. Helpers live in serving_testlib.py.
"""

import os
import shutil
import textwrap

import pytest
from serving_testlib import ex, make_model, start_server

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
    from serving.client import ElmoClient

    with ElmoClient(f"127.0.0.1:{server.grpc_port}", model_name="elmo", timeout=60) as c:
        yield c


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
