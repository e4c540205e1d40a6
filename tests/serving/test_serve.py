"""serving/serve.py (elmo_tf/cli/serve.py): hands over to a `tensorflow_model_server` on PATH with the same flags (a
fake one records its argv) and never to a wider address than asked (issue 12, item 10), runs the embedded server
otherwise (real subprocess: gRPC + REST, graceful exit on SIGTERM), reads TF Serving's config files
(elmo_tf/serving/config_files.py)."""

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import forked
import pytest
from cli_testlib import own_lines
from serving_testlib import (
    REPO,
    SERVE,
    SERVED_WITHIN,
    VALID,
    assert_parity,
    free_port,
    kill_if_running,
    listening_addresses,
    reference_sentences,
    report,
    rss_mib,
    serve_embedded,
    stop_with_sigterm,
    wait_for,
)

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.config_files import (
    VersionPolicy,
    batching_parameters_class,
    parse_batching_parameters,
    parse_model_config,
)


def test_runs_the_stock_server_with_the_same_flags(fake_stock_server):
    fake, record, env = fake_stock_server
    result = forked.run(
        [
            sys.executable,
            SERVE,
            "--model_base_path",
            "/models/elmo",
            "--model_name",
            "elmo",
            "--port",
            "8600",
            "--rest_api_port=8601",
            "--enable_batching",
            "--file_system_poll_wait_seconds",
            "2",
            "--batching_parameters_file",
            "/cfg/batching.config",
            "--host",
            "0.0.0.0",
            "--max_request_sentences",
            "8",
            "--load_retry_interval_micros=5000000",
            "--max_requests_in_flight=8",
            "--monitoring_config_file=/cfg/monitoring.config",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr  # the exec'd program's status
    argv = record.read_text().splitlines()
    assert argv == [
        str(fake),
        "--port=8600",
        "--rest_api_port=8601",
        "--model_name=elmo",
        "--model_base_path=/models/elmo",
        "--enable_batching=true",
        "--batching_parameters_file=/cfg/batching.config",
        "--file_system_poll_wait_seconds=2",
        "--load_retry_interval_micros=5000000",
        "--monitoring_config_file=/cfg/monitoring.config",
    ]
    assert "does not know --max_request_sentences --max_requests_in_flight: dropped" in result.stderr
    assert "listens on all interfaces (--host 0.0.0.0)" in result.stderr


@pytest.mark.parametrize("host", [None, "127.0.0.1", "10.1.2.3", "localhost"])
def test_refuses_to_hand_over_an_address_the_stock_server_cannot_bind(fake_stock_server, host):
    """The stock server listens on all interfaces: a local-only (default) or specific --host is refused, exit 2."""
    _, record, env = fake_stock_server
    argv = [sys.executable, SERVE, "--model_base_path", "/models/elmo", "--port", "8600"]
    argv += ["--host", host] if host else []
    result = forked.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert not record.exists()  # the stock server never ran
    expected = host or "127.0.0.1 (the default)"
    assert f"argument --host: tensorflow_model_server cannot bind {expected}" in result.stderr
    assert "listens on all interfaces; pass --host 0.0.0.0" in result.stderr and "--embedded" in result.stderr


def test_the_launcher_does_not_load_tensorflow(fake_stock_server):
    """Handing over must be quick: serve.py imports TensorFlow only for the embedded server."""
    _, record, env = fake_stock_server
    code = (
        f"import sys; sys.argv = ['serve.py', '--model_base_path', '/m', '--host', '::']; "
        f"sys.path.insert(0, {str(REPO)!r}); "
        f"import os; os.execv = lambda *a: (print('tf' if 'tensorflow' in sys.modules else 'no tf'), "
        f"sys.exit(0)); from elmo_tf.cli import serve; serve.main()"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "no tf", result.stderr


PORT_0_ERROR = (
    "serve.py: error: argument --port: 0 turns gRPC's TCP port off and no --grpc_socket_path is given: At least one "
    "of server_options.grpc_port or server_options.grpc_socket_path must be set.\n"
)


def test_flag_errors_exit_2():
    for argv, match in [
        ([], "--model_base_path: required"),
        (["--model_base_path", "/no/such/dir"], "not a directory"),
        (["--model_base_path", "/tmp", "--port", "x"], "--port must be an integer"),
        # a TCP port (issue 27): stock would listen on 70000 % 65536 = 4464 for REST
        (["--model_base_path", "/tmp", "--rest_api_port", "70000"], "--rest_api_port must be <= 65535, got '70000'"),
        (["--model_base_path", "/tmp", "--port", "65536"], "--port must be <= 65535, got '65536'"),
        (["--model_base_path", "/tmp", "--port", "-1"], "--port must be >= 0, got '-1'"),
        (["--model_base_path", "/tmp", "--port", "\u0668\u0665\u0660\u0660"], "--port must be an integer"),
        (["--model_base_path", "/tmp", "--enable_batching=maybe"], "expected true or false"),
        (["--model_base_path", "/tmp", "--unknown_flag=1"], "unrecognized arguments: --unknown_flag"),
        # stock's Server::BuildAndStart (server.cc) refuses --port 0 without --grpc_socket_path
        (["--model_base_path", "/tmp", "--port", "0"], PORT_0_ERROR),
        (["--model_base_path", "/tmp", "--port=0", "--grpc_socket_path="], PORT_0_ERROR),
    ]:
        result = forked.run([sys.executable, SERVE, "--embedded", *argv], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and match in result.stderr, (argv, result.stderr)
        assert match != PORT_0_ERROR or result.stderr == PORT_0_ERROR, result.stderr  # the one line, whole


def test_port_0_and_the_grpc_socket_path_with_the_stock_server(fake_stock_server):
    """--port 0 alone is refused before the hand-over too (exit 2, the stock server never runs: it would refuse it,
    Server::BuildAndStart in server.cc); with --grpc_socket_path both are passed on (main.cc's `main` declares both
    flags)."""
    _, record, env = fake_stock_server
    argv = [sys.executable, SERVE, "--model_base_path", "/models/elmo", "--host", "0.0.0.0", "--port", "0"]
    result = forked.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (2, PORT_0_ERROR) and not record.exists()
    result = forked.run(
        argv + ["--grpc_socket_path", "/run/tfs.sock"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    assert record.read_text().splitlines()[1:] == [
        "--port=0",
        "--grpc_socket_path=/run/tfs.sock",
        "--model_base_path=/models/elmo",
    ]


def test_flags_reach_the_server_options():
    """--port 0 with --grpc_socket_path is gRPC on the socket only (`port=None`: the library's port 0 picks a free
    port); --enable_model_warmup=false reaches the loader (stock: Server::BuildAndStart in server.cc)."""
    import argparse

    from elmo_tf.cli.serve import DEFAULTS, server_options

    given = {"port": 0, "grpc_socket_path": "/tmp/s.sock", "enable_model_warmup": False}
    args = argparse.Namespace(**{**DEFAULTS, **given})
    options = server_options(args, {})
    assert (options.port, options.grpc_socket_path, options.enable_model_warmup) == (None, "/tmp/s.sock", False)
    options = server_options(argparse.Namespace(**DEFAULTS), {})
    assert (options.port, options.grpc_socket_path, options.enable_model_warmup) == (8500, None, True)


def test_config_files(tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text(
        "max_batch_size { value: 16 }\nbatch_timeout_micros { value: 2000 }\n"
        "num_batch_threads { value: 3 }\npad_variable_length_inputs: true\n# a comment\n"
    )
    assert parse_batching_parameters(str(batching)) == {
        "max_batch_size": 16,
        "batch_timeout_micros": 2000,
        "num_batch_threads": 3,
    }
    models = tmp_path / "models.config"
    models.write_text(
        textwrap.dedent("""\
        model_config_list {
          config { name: "elmo" base_path: "/models/elmo" model_platform: "tensorflow" }
          config { name: "elmo_small" base_path: "/models/elmo_small" }
          config { name: "remote" base_path: "gs://bucket/elmo" }
        }
    """)
    )
    expected = {"elmo": "/models/elmo", "elmo_small": "/models/elmo_small", "remote": "gs://bucket/elmo"}
    configs = parse_model_config(str(models))
    assert {name: c.base_path for name, c in configs.items()} == expected
    assert all(c.version_policy == VersionPolicy("latest", 1) and not c.version_labels for c in configs.values())


# What TF Serving's main.cc refuses: it reads --batching_parameters_file with ParseProtoTextFile (protobuf's text
# format: an unknown field, a misspelt one inside a value, a field given twice, a stray line are errors); the embedded
# server bounds the values it uses (issue 38: 10^16 microseconds killed its batch thread at the first request)
@pytest.mark.parametrize(
    "text, needles",
    [
        ("max_batch_sizes { value: 16 }", ['no field named "max_batch_sizes"']),
        ("max_batch_size { valeu: 16 }", ['no field named "valeu"']),
        ("max_batch_size { value: 16 }\nmax_batch_size { value: 8 }", ['multiple "max_batch_size" fields']),
        ("max_batch_size { value: 16 }\njunk\n", ["2:1", "junk"]),
        ("batch_timeout_micros { value: 10000000000000000 }", ["batch_timeout_micros", "<= 60000000 (a minute"]),
        ("max_batch_size { value: 0 }", ["max_batch_size", "must be >= 1, got 0"]),
        ("num_batch_threads { value: 100000 }", ["num_batch_threads", "must be <= 1024"]),
        ("batch_timeout_micros { value: -1 }", ["batch_timeout_micros", "must be >= 0, got -1"]),
        ("max_batch_size { value: 99999999999999999999 }", ["max_batch_size", "99999999999999999999"]),
    ],
)
def test_batching_parameters_tf_serving_refuses_are_refused_naming_the_file(tmp_path, text, needles):
    path = tmp_path / "batching.config"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        parse_batching_parameters(str(path))
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, (needle, message)


# server_core.cc ValidateModelConfigList: a model name listed twice, a relative base_path
@pytest.mark.parametrize(
    "entries, needle",
    [
        (
            'config { name: "m" base_path: "/a" } config { name: "m" base_path: "/b" }',
            "Illegal to list model m multiple times in config list",
        ),
        ('config { name: "rel" base_path: "models/rel" }', "Expected model rel to have an absolute path or URI"),
        ('config { name: "dot" base_path: "./m" }', "got base_path()=./m"),
    ],
)
def test_model_config_tf_serving_refuses_is_refused(tmp_path, entries, needle):
    path = tmp_path / "models.config"
    path.write_text(f"model_config_list {{ {entries} }}")
    with pytest.raises(ValueError, match=re.escape(needle)) as info:
        parse_model_config(str(path))
    assert str(path) in str(info.value)


def test_config_file_errors_exit_2_with_one_line(tmp_path):
    """The command line: one line naming the flag, the file and the field, exit 2, before any model loads; the flags
    of the same names are bounded alike."""
    batching, models = tmp_path / "batching.config", tmp_path / "models.config"
    batching.write_text("batch_timeout_micros { value: 10000000000000000 }")
    models.write_text('model_config_list { config { name: "m" base_path: "/a" } config { name: "m" base_path: "/b" } }')
    for argv, needles in [
        (
            ["--model_base_path", "/tmp", "--batching_parameters_file", batching],
            ["--batching_parameters_file", str(batching), "batch_timeout_micros", "must be <= 60000000"],
        ),
        (["--model_config_file", models], ["--model_config_file", "Illegal to list model m multiple times"]),
        (
            ["--model_base_path", "/tmp", "--batch_timeout_micros", "10000000000000000"],
            ["--batch_timeout_micros must be <= 60000000"],
        ),
        (["--model_base_path", "/tmp", "--num_batch_threads", "5000"], ["--num_batch_threads must be <= 1024"]),
    ]:
        result = forked.run(
            [sys.executable, SERVE, "--embedded", *map(str, argv)], capture_output=True, text=True, timeout=60
        )
        lines = own_lines(result.stderr)
        assert result.returncode == 2 and len(lines) == 1, (argv, result.stderr)
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])


def test_the_shipped_batching_parameters_parse_as_tf_serving_and_the_embedded_server_read_them():
    """export/batching.config is a BatchingParameters text proto that TF Serving's parser takes (text_format, as
    main.cc's ParseProtoTextFile does), and the embedded server reads its three fields."""
    from google.protobuf import text_format

    text = (REPO / "export" / "batching.config").read_text()
    params = text_format.Parse(text, batching_parameters_class()())
    assert (params.max_batch_size.value, params.batch_timeout_micros.value, params.num_batch_threads.value) == (
        32,
        2000,
        2,
    )
    assert params.max_enqueued_batches.value == 16 and params.pad_variable_length_inputs
    assert not params.allowed_batch_sizes and not params.HasField("enable_large_batch_splitting")
    assert parse_batching_parameters(str(REPO / "export" / "batching.config")) == {
        "max_batch_size": 32,
        "batch_timeout_micros": 2000,
        "num_batch_threads": 2,
    }


def assert_serves_the_model(target, model, sentences):
    """A gRPC client at `target` waits for the "elmo" model, then gets the Keras `model`'s numbers for `sentences`."""
    with ElmoClient(target, "elmo", timeout=30) as client:
        client.wait_for_model(timeout=120)
        assert_parity(reference_sentences(model, sentences), client.embed(sentences))


def test_embedded_server_end_to_end(base_path, model, fake_stock_server):
    """--embedded wins over a stock binary on PATH; gRPC and REST answer, with the batching parameters shipped for
    stock TF Serving (export/batching.config); SIGTERM stops it with status 0."""
    _, record, env = fake_stock_server
    port, rest_port = free_port(), free_port()
    batching = REPO / "export" / "batching.config"
    process = forked.Popen(
        [
            sys.executable,
            SERVE,
            "--embedded",
            "--model_base_path",
            base_path,
            "--model_name",
            "elmo",
            "--port",
            str(port),
            "--rest_api_port",
            str(rest_port),
            "--batching_parameters_file",
            str(batching),
            "--tensorflow_intra_op_parallelism",
            "2",
            "--max_requests_in_flight",
            "4",
            "--load_retry_interval_micros",
            "1000",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert_serves_the_model(f"127.0.0.1:{port}", model, ["served by a subprocess"])
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v1/models/elmo", timeout=30) as response:
            assert json.load(response)["model_version_status"][0]["state"] == "AVAILABLE"
        start = time.monotonic()
        output = stop_with_sigterm(process)
        assert process.returncode == 0, output
        assert time.monotonic() - start < 30
    finally:
        kill_if_running(process)
    assert not record.exists()  # the fake stock server never ran
    assert "embedded model server ready" in output and f"gRPC 127.0.0.1:{port}" in output
    assert "batching parameter max_enqueued_batches is not used by the embedded server" in output
    assert "received SIGTERM: shutting down" in output and "server stopped" in output


@pytest.mark.slow
def test_stock_server_is_never_given_a_wider_address_than_asked(fake_stock_server, base_path, expected):
    """Item 10: serve.py dropped --host when it handed over to tensorflow_model_server, which listens on all
    interfaces. Now the default (127.0.0.1) and explicit local addresses are refused (exit 2, the stock server never
    runs); the embedded server asked for the same address listens on 127.0.0.1 only, and serves."""
    _, record, env = fake_stock_server
    port, rest_port = free_port(), free_port()
    flags = ["--model_base_path", base_path, "--model_name", "elmo", "--port", str(port)]
    for host in ([], ["--host", "127.0.0.1"], ["--host", "::1"]):
        result = forked.run([sys.executable, SERVE, *flags, *host], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "listens on all interfaces" in result.stderr, result.stderr
        assert not record.exists()
    process = forked.Popen(
        [sys.executable, SERVE, "--embedded", *flags, "--rest_api_port", str(rest_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with ElmoClient(f"127.0.0.1:{port}", "elmo", timeout=30) as c:
            c.wait_for_model(timeout=120)
            before = rss_mib(process.pid)
            for _ in range(20):
                assert_parity(expected, c.embed(VALID))
            start = time.monotonic()
            assert_parity(expected, c.embed(VALID))
            served = time.monotonic() - start
        after = rss_mib(process.pid)
        addresses = listening_addresses(process.pid)
        assert {p for _, p in addresses} >= {port, rest_port}, addresses
        loopback = ("127.0.0.1", "::ffff:127.0.0.1")  # the second: an IPv6 socket bound to the IPv4 loopback
        assert all(host in loopback for host, p in addresses if p in (port, rest_port)), addresses
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v1/models/elmo", timeout=10) as response:
            assert json.load(response)["model_version_status"][0]["state"] == "AVAILABLE"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert not record.exists()
    report("item 10: embedded server on 127.0.0.1 only (subprocess)", before, after, served)
    assert served < SERVED_WITHIN and after - before < 50


def test_port_0_with_a_grpc_socket_path_serves_grpc_on_the_socket_only(base_path, model):
    """`serve.py --embedded --port 0 --grpc_socket_path S`: gRPC listens on "unix:S" and on no TCP port, as stock's
    (Server::BuildAndStart in server.cc: the TCP port only when it is not 0); a real client over the socket is answered
    with the Keras model's numbers, and REST listens on its own port."""
    import os
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="elmo-sock-", dir="/tmp")  # sun_path holds 108 bytes
    path = os.path.join(directory, "grpc.sock")
    rest_port = free_port()
    process = forked.Popen(
        [sys.executable, SERVE, "--embedded", "--model_base_path", base_path, "--model_name", "elmo"]
        + ["--port", "0", "--grpc_socket_path", path, "--rest_api_port", str(rest_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert_serves_the_model(f"unix:{path}", model, ["served over a unix socket"])
        # REST starts after gRPC (server.cc's order): wait for it, then gRPC must have no TCP port of its own
        wait_for(lambda: rest_port in {p for _, p in listening_addresses(process.pid)}, 30, "the REST port")
        assert {port for _, port in listening_addresses(process.pid)} == {rest_port}
        output = stop_with_sigterm(process)
        assert process.returncode == 0, output[-3000:]
    finally:
        kill_if_running(process)
        shutil.rmtree(directory, ignore_errors=True)
    assert f"gRPC unix:{path}, REST 127.0.0.1:{rest_port}" in output, output[-3000:]


@pytest.mark.slow
def test_serve_answers_a_converted_elmoformanylangs_model_with_its_in_process_numbers(tmp_path):
    """serve.py --embedded on the export of a converted ELMoForManyLangs model (char and word vocabulary lookups in
    the graph): the gRPC answers are the Keras model's in this process (1e-5), for sentences and for tokens."""
    from convert_testlib import converted_efml
    from serving_testlib import ex

    from elmo_tf.models import load_elmo

    model_dir = converted_efml(tmp_path / "converted", "word")
    model = load_elmo(model_dir / "options.json", model_dir / "weights.hdf5")
    base = tmp_path / "elmo"
    ex.export_elmo(model, str(base))
    port = free_port()
    process = serve_embedded(
        "--model_base_path", base, "--model_name", "elmo", "--port", port, "--load_retry_interval_micros", "1000"
    )
    try:
        with ElmoClient(f"127.0.0.1:{port}", "elmo", timeout=30) as client:
            client.wait_for_model(timeout=120)
            sentences = ["Мама мыла раму .", "Café naïve " + "ж" * 60, "日本語 <bos> x"]
            assert_parity(reference_sentences(model, sentences), client.embed(sentences))
            token_lists = [["Ёж", "!"], ["façade"]]
            expected = ex.reference_outputs(model, [[t.encode() for t in row] for row in token_lists])
            assert_parity(expected, client.embed_tokens(token_lists))
        output = stop_with_sigterm(process)
        assert process.returncode == 0, output[-3000:]
    finally:
        kill_if_running(process)
