"""Helpers of the serving tests: the test model, free ports, servers, Keras reference outputs, parity checks, and the
checks every hostile case ends with (a valid request served in time, the RSS growth reported).

The model has projection 32 so that 16 sentences of 400 tokens with all outputs (about 5.7 MB) exceed gRPC's
4 MiB default message size.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import elmo_tf.saved_model.export as ex

REPO = Path(__file__).resolve().parents[2]
SERVE = str(REPO / "serving" / "serve.py")
VALID = ["a valid request after the hostile one", "short"]  # the request every hostile case ends with
SERVED_WITHIN = 5.0  # seconds for the valid request after each case

ATOL = 1e-5
SERVING_CONFIG = dict(
    char_embedding_dim=4, filters=((1, 8), (2, 8), (3, 16)), num_highway=1, lstm_dim=64, projection_dim=32, num_layers=2
)


def make_model(seed):
    import keras

    from elmo_tf import BiLMConfig, ELMo

    keras.utils.set_random_seed(seed)
    return ELMo(BiLMConfig(**SERVING_CONFIG))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference_sentences(model, sentences):
    """The Keras model's outputs for sentences (str/bytes), whitespace-tokenized as the export does."""
    return ex.reference_outputs(model, ex.reference_tokens(sentences))


def reference_tokens(model, token_lists):
    """The Keras model's outputs for token lists (str/bytes)."""
    return ex.reference_outputs(model, [[t.encode() if isinstance(t, str) else t for t in row] for row in token_lists])


def assert_parity(expected, actual, keys=None, atol=ATOL):
    """Same keys (or `keys`), same shapes, floats within `atol`, ints and bools equal."""
    keys = sorted(expected) if keys is None else sorted(keys)
    assert sorted(actual) == keys, f"outputs {sorted(actual)}, expected {keys}"
    for key in keys:
        want, got = np.asarray(expected[key]), np.asarray(actual[key])
        assert got.shape == want.shape, f"{key}: shape {got.shape}, expected {want.shape}"
        if want.dtype.kind == "f":
            assert got.dtype == np.float32, f"{key}: dtype {got.dtype}"
            if want.size:
                np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(got.astype(want.dtype), want, err_msg=key)


def start_server(base, **options):
    from elmo_tf.serving.options import ServerOptions
    from elmo_tf.serving.server import ModelServer

    options.setdefault("port", 0)
    options.setdefault("rest_api_port", 0)
    return ModelServer({"elmo": base}, ServerOptions(**options)).start()


def wait_for(condition, timeout, what):
    """Polls `condition()` every 20 ms until it is true; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rss_mib(pid="self"):
    """Resident memory of process `pid` in MiB (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError(f"no VmRSS in /proc/{pid}/status")


def listening_addresses(pid):
    """The (host, port) of every TCP socket process `pid` listens on, from /proc/<pid>/net/tcp and tcp6."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                if size == 4:
                    host = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:  # four little-endian 32-bit words
                    host = socket.inet_ntop(socket.AF_INET6, b"".join(raw[k : k + 4][::-1] for k in range(0, 16, 4)))
                found.append((host, int(port, 16)))
    return found


def assert_serves(server, expected, version=1):
    """A valid request is answered correctly by `version` within SERVED_WITHIN seconds; returns the seconds."""
    start = time.monotonic()
    from elmo_tf.serving.client import ElmoClient

    with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=SERVED_WITHIN, max_retries=0) as c:
        out = c.embed(VALID)
    elapsed = time.monotonic() - start
    assert out.model_version == version
    assert_parity(expected, out)
    return elapsed


def report(case, before, after, served):
    print(f"\n[{case}] RSS {before:.1f} -> {after:.1f} MiB ({after - before:+.1f}); valid request {served:.3f} s")


def statuses(client):
    return [(s["version"], s["state"]) for s in client.model_status()]


def copy_version(base, source, name, files=None):
    """Copies version directory `source` to `name` under `base`: whole, or only `files` (a copy under way). Built beside
    the base and renamed into it, so that the server's polls (every 50 ms in some tests) never see it half-written
    (on a slow machine a poll between two files made an extra failed load that the tests count)."""
    stage = os.path.join(os.path.dirname(base), f".stage-{os.path.basename(base)}-{name}")
    if files is None:
        shutil.copytree(os.path.join(base, source), stage)
    else:
        os.makedirs(stage)
        for f in files:
            shutil.copy(os.path.join(base, source, f), os.path.join(stage, f))
    os.rename(stage, os.path.join(base, str(name)))


def messages(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def serve_embedded(*flags, env=None):
    """`serving/serve.py --embedded FLAGS...` forked from the worker's fork server (`forked.Popen`), its stdout and
    stderr together as text."""
    import forked

    return forked.Popen(
        [sys.executable, SERVE, "--embedded", *map(str, flags)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_with_sigterm(process, timeout=60):
    """Sends SIGTERM to a served subprocess and returns its whole output once it has exited (`timeout` s at most)."""
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=timeout)
    return output


def kill_if_running(process):
    """The `finally` of a test that started a server: kills it if it still runs, and reaps it."""
    if process.poll() is None:
        process.kill()
        process.communicate()
