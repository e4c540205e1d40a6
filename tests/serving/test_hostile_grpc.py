"""Hostile clients and hostile model directories against real embedded servers on 127.0.0.1 over gRPC (issue 12,
items 5, 6, 7, 9, 10, the in-flight cap, deadlines and gRPC's max receive size). Each case is bounded in time; after
it a valid request is served within a few seconds, and the growth of the server's resident memory is bounded (the
server runs in this process, except for item 10's subprocess; the numbers are printed, `pytest -s` shows them).
"""

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from serving_testlib import (
    REPO,
    assert_parity,
    free_port,
    listening_addresses,
    reference_sentences,
    rss_mib,
    start_server,
    wait_for,
)
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from serving.batching import BatchingOptions
from serving.client import ElmoClient
from serving.status import ServingError

VALID = ["a valid request after the hostile one", "short"]
SERVED_WITHIN = 5.0  # seconds for the valid request after each case
SERVE = str(REPO / "serving" / "serve.py")
INT64_MAX = str(2**63 - 1)


@pytest.fixture(scope="module")
def expected(model):
    return reference_sentences(model, VALID)


def assert_serves(server, expected, version=1):
    """A valid request is answered correctly by `version` within SERVED_WITHIN seconds; returns the seconds."""
    start = time.monotonic()
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
    """Copies version directory `source` to `name` under `base`: whole, or only `files` (a copy under way)."""
    if files is None:
        shutil.copytree(os.path.join(base, source), os.path.join(base, name))
        return
    os.makedirs(os.path.join(base, name))
    for f in files:
        shutil.copy(os.path.join(base, source, f), os.path.join(base, name, f))


def messages(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# ---------------------------------------------------------------------------------------------------- item 5


def test_version_names_that_are_not_int64_are_ignored_and_gone_versions_forgotten(fresh_base, expected, caplog):
    """Item 5: "99999999999999999999" (above int64) beside version 1 made every Predict and GetModelStatus INTERNAL.
    Now it, 2**63 (the first overflow), a non-ASCII digit, "1e3" and "-2" are ignored with one log line each over
    many polls, while 2**63 - 1 is a version; when that version's directory goes, its state goes too."""
    caplog.set_level(logging.WARNING, logger="serving.registry")
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.05)
    try:
        assert_serves(server, expected)
        before = rss_mib()
        for name in ("99999999999999999999", str(2**63), "\u0663", "1e3", "-2"):
            copy_version(fresh_base, "1", name)  # complete SavedModels: only their names are wrong
        time.sleep(1.0)  # about 20 polls
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            for _ in range(10):
                assert c.model_status() == [
                    {"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}
                ]
                assert c.embed(VALID).model_version == 1
        overflow = messages(caplog, "'99999999999999999999'")
        assert len(overflow) == 1 and "a number above 2**63 - 1" in overflow[0], overflow
        assert len(messages(caplog, f"'{2**63}'")) == 1
        assert len(messages(caplog, "'1e3'")) == 1 and "not a version number" in messages(caplog, "'1e3'")[0]

        copy_version(fresh_base, "1", INT64_MAX)  # the largest version number there is
        wait_for(lambda: server.managers["elmo"].served_version == 2**63 - 1, 30, "version 2**63 - 1 served")
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            assert c.embed(VALID, version=2**63 - 1).model_version == 2**63 - 1
            wait_for(lambda: statuses(c) == [(2**63 - 1, "AVAILABLE"), (1, "END")], 10, "version 1 END")
            shutil.rmtree(os.path.join(fresh_base, INT64_MAX))  # gone from disk: version 1 comes back
            wait_for(lambda: statuses(c) == [(1, "AVAILABLE")], 30, "version 1 alone, 2**63 - 1 forgotten")
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    report("item 5: overflowing names, int64 max version loaded and removed", before, after, served)
    assert after - before < 300  # two more loads of the small model; the bug grew nothing but failed every request


# ---------------------------------------------------------------------------------------------------- item 6


def test_zero_padded_version_directory_is_its_number(fresh_base, expected, caplog):
    """Item 6: "007" never loaded. It is version 7; "07" beside it names the same version (TF Serving reads the name
    that sorts last, "07"), logged once and not reloaded."""
    caplog.set_level(logging.WARNING, logger="serving.registry")
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.05)
    manager = server.managers["elmo"]
    try:
        assert_serves(server, expected)
        before = rss_mib()
        copy_version(fresh_base, "1", "007")
        wait_for(lambda: manager.served_version == 7, 30, "version 7 served from '007'")
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            assert c.embed(VALID, version=7).model_version == 7
            wait_for(lambda: statuses(c) == [(7, "AVAILABLE"), (1, "END")], 10, "version 1 END")
            with manager.acquire() as served_before:
                pass
            copy_version(fresh_base, "1", "07")
            time.sleep(0.5)  # about 10 polls
            with manager.acquire() as served_after:
                assert served_after is served_before  # the same version: not loaded again
            assert statuses(c) == [(7, "AVAILABLE"), (1, "END")]
        assert len(messages(caplog, "'007'")) == 1 and "version 7 is read from '07'" in messages(caplog, "'007'")[0]
        served = assert_serves(server, expected, version=7)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    report("item 6: '007' is version 7", before, after, served)
    assert after - before < 200


# ---------------------------------------------------------------------------------------------------- item 7


def test_failed_load_is_retried_and_a_slow_copy_loads_once_complete(fresh_base, expected, caplog):
    """Item 7: retries gave up after ~6 s, leaving a slowly copied model END forever. Now a version whose copy is
    under way (saved_model.pb there, its variables not yet) is retried `load_retry_interval_micros` apart,
    `max_num_load_retries` times, while version 1 serves every request; after the last retry it is not tried again
    until its files change, and it loads once the copy is complete."""
    caplog.set_level(logging.INFO, logger="serving.registry")
    server = start_server(
        fresh_base,
        rest_api_port=None,
        file_system_poll_wait_seconds=0.05,
        max_num_load_retries=2,
        load_retry_interval_micros=200_000,
    )
    manager = server.managers["elmo"]
    stop, failures, answers = threading.Event(), [], []

    def client_loop():
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            while not stop.is_set():
                try:
                    out = c.embed(VALID)
                    assert_parity(expected, out)
                    answers.append(out.model_version)
                except Exception as e:  # any failure counts
                    failures.append(f"{type(e).__name__}: {e}")
                    return

    thread = threading.Thread(target=client_loop)
    try:
        assert_serves(server, expected)
        before = rss_mib()
        thread.start()
        copy_version(fresh_base, "1", "2", files=["saved_model.pb", "fingerprint.pb"])  # variables still to come
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            wait_for(lambda: (2, "START") in statuses(c), 30, "version 2 waiting for a retry")
            status = {s["version"]: s for s in c.model_status()}[2]
            assert status["error_code"] == "NOT_FOUND" and "variables" in status["error_message"], status
            wait_for(lambda: (2, "END") in statuses(c), 30, "version 2 given up after 1 + 2 attempts")
            attempts = messages(caplog, "loading elmo version 2 from")
            assert len(attempts) == 6 and len(messages(caplog, "failed (attempt")) == 3, attempts  # tried, failed
            time.sleep(0.6)  # 12 polls, 3 retry intervals: the unchanged files are not tried again
            assert len(messages(caplog, "loading elmo version 2 from")) == 6
            assert statuses(c) == [(2, "END"), (1, "AVAILABLE")]
            shutil.copytree(os.path.join(fresh_base, "1", "variables"), os.path.join(fresh_base, "2", "variables"))
            shutil.copytree(os.path.join(fresh_base, "1", "assets"), os.path.join(fresh_base, "2", "assets"))
            wait_for(lambda: manager.served_version == 2, 30, "version 2 served once its copy is complete")
            wait_for(lambda: statuses(c) == [(2, "AVAILABLE"), (1, "END")], 10, "version 1 END")
        wait_for(lambda: 2 in answers or failures, 10, "an answer from version 2")
        stop.set()
        thread.join(30)
        served = assert_serves(server, expected, version=2)
        after = rss_mib()
    finally:
        stop.set()
        thread.join(30)
        server.stop(grace=1.0)
    assert not failures, failures  # version 1 answered every request while version 2 failed
    assert answers.count(1) > 0 and answers[-1] == 2
    report("item 7: a slow copy retried, then loaded", before, after, served)
    assert after - before < 200


# ---------------------------------------------------------------------------------------------------- item 9


def test_messages_never_show_the_server_paths(fresh_base, expected):
    """Item 9: GetModelStatus and error messages showed the server's absolute paths. A failed load whose error
    names a file (a copy without variables) is reported relative to "<base path of elmo>", over gRPC and REST; no
    answer holds the base path, its real path, or the temporary directory."""
    server = start_server(fresh_base, file_system_poll_wait_seconds=0.05, max_num_load_retries=0)
    forbidden = {fresh_base, os.path.realpath(fresh_base), os.path.dirname(fresh_base), "/tmp"}
    try:
        assert_serves(server, expected)
        before = rss_mib()
        copy_version(fresh_base, "1", "4", files=["saved_model.pb"])
        os.makedirs(os.path.join(fresh_base, "5"))
        with open(os.path.join(fresh_base, "5", "saved_model.pb"), "wb") as f:
            f.write(b"not a SavedModel")
        texts = []
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            wait_for(lambda: {(4, "END"), (5, "END")} <= set(statuses(c)), 30, "versions 4 and 5 END")
            status = {s["version"]: s for s in c.model_status()}
            assert "<base path of elmo>/4/variables/variables" in status[4]["error_message"], status[4]
            assert status[5]["error_message"], status[5]
            for version in (None, 4, 5):
                request = get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = "elmo"
                if version is not None:
                    request.model_spec.version.value = version
                texts.append(str(models.GetModelStatus(request, timeout=10)))
            for call in (
                lambda: c.embed(VALID, version=4),
                lambda: c.predict({"sentences": ["x"]}, signature_name="nope"),
                lambda: c.predict({"nope": ["x"]}),
            ):
                with pytest.raises(ServingError) as info:
                    call()
                texts.append(info.value.details)
            texts.append(str(c.metadata()))
        channel.close()
        for path in ("/v1/models/elmo", "/v1/models/elmo/versions/4", "/v1/models/elmo/versions/5"):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}{path}", timeout=10) as response:
                texts.append(response.read().decode())
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}/v1/models/elmo/versions/4:predict", b"{}", 10)
        except urllib.error.HTTPError as e:
            texts.append(e.read().decode())
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    assert any("<base path of elmo>" in t for t in texts)
    for text in texts:
        for path in forbidden:
            assert path not in text, (path, text)
    report("item 9: no server paths in answers", before, after, served)
    assert after - before < 100


# ---------------------------------------------------------------------------------------------------- item 10


def test_stock_server_is_never_given_a_wider_address_than_asked(fake_stock_server, base_path, expected):
    """Item 10: serve.py dropped --host when it handed over to tensorflow_model_server, which listens on all
    interfaces. Now the default (127.0.0.1) and explicit local addresses are refused (exit 2, the stock server never
    runs); the embedded server asked for the same address listens on 127.0.0.1 only, and serves."""
    _, record, env = fake_stock_server
    port, rest_port = free_port(), free_port()
    flags = ["--model_base_path", base_path, "--model_name", "elmo", "--port", str(port)]
    for host in ([], ["--host", "127.0.0.1"], ["--host", "::1"]):
        result = subprocess.run(
            [sys.executable, SERVE, *flags, *host], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2 and "listens on all interfaces" in result.stderr, result.stderr
        assert not record.exists()
    process = subprocess.Popen(
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


# ---------------------------------------------------------------------------------------------------- budget


SLOW = [" ".join(f"w{i % 50}" for i in range(1000))] * 16  # 16000 tokens of work, within the default budget


def warm_up_slow_requests(server):
    """Two slow requests at once, so the model's working memory for them is there before RSS is measured."""
    threads = [threading.Thread(target=slow_request, args=(server, [])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def slow_request(server, results):
    """Sends SLOW (0.2-0.6 s of the model on two idle cores, by machine and version); appends its `default` shape or its
    error."""
    with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=120, max_retries=0) as c:
        try:
            results.append(c.embed(SLOW, output_filter=["default"])["default"].shape)
        except Exception as e:
            results.append(f"{type(e).__name__}: {e}")


def test_requests_beyond_the_in_flight_cap_are_refused_at_once(base_path, expected):
    """Two slow requests hold both slots of max_requests_in_flight=2: a third is answered RESOURCE_EXHAUSTED at once,
    naming the limit and its flag; the slow ones still succeed."""
    server = start_server(  # 16 rows a call: the two slow requests never merge into one bigger call
        base_path,
        rest_api_port=None,
        max_requests_in_flight=2,
        batching=BatchingOptions(max_batch_size=16, num_threads=1),
    )
    results = []
    threads = [threading.Thread(target=slow_request, args=(server, results)) for _ in range(2)]
    try:
        assert_serves(server, expected)
        warm_up_slow_requests(server)
        before = rss_mib()
        for t in threads:
            t.start()
        wait_for(lambda: server.stats()["in_flight"] == 2, 30, "two requests in flight")
        start = time.monotonic()
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            with pytest.raises(ServingError) as info:
                c.embed(VALID)
        refused = time.monotonic() - start
        assert server.stats()["in_flight"] == 2  # the slow ones were still running: the refusal did not wait
        for t in threads:
            t.join(120)
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of requests in flight (--max_requests_in_flight 2)" in info.value.details
    assert refused < 1.0, refused
    assert results == [(16, 64), (16, 64)], results
    assert server.stats()["rejected_in_flight"] == 1
    print(f"\n[in-flight cap] refused in {refused:.3f} s")
    report("in-flight cap", before, after, served)
    assert after - before < 200  # allocator noise of 16000-token model calls


def test_requests_whose_deadline_passes_in_the_queue_are_not_run(base_path, expected):
    """Behind slow requests queued on the one batch thread (at least a second of model time, however fast the machine),
    three requests with a 0.3 s deadline get DEADLINE_EXCEEDED and are dropped from the queue: the model runs only the
    slow requests."""
    server = start_server(base_path, rest_api_port=None, batching=BatchingOptions(max_batch_size=16, num_threads=1))
    results, codes = [], []  # 16 rows a call: the late requests cannot ride along with a slow one

    def late(k):
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=0.3, max_retries=0) as c:
            try:
                c.embed([f"late {k}"])
                codes.append("served")
            except ServingError as e:
                codes.append(e.code)

    late_threads = [threading.Thread(target=late, args=(k,)) for k in range(3)]
    try:
        assert_serves(server, expected)
        warm_up_slow_requests(server)
        start = time.monotonic()
        slow_request(server, [])
        one_call = time.monotonic() - start
        # Enough slow requests that the ones still queued when the late requests arrive hold the thread for >= 1 s:
        # a fixed count broke when the model got faster (two calls of 0.2 s finished inside the 0.3 s deadline).
        count = max(2, math.ceil(1.0 / one_call) + 2)
        threads = [threading.Thread(target=slow_request, args=(server, results)) for _ in range(count)]
        before_stats, before = server.stats(), rss_mib()
        for t in threads:
            t.start()
        wait_for(lambda: server.stats()["in_flight"] == count, 30, f"{count} slow requests in flight")
        for t in late_threads:
            t.start()
        for t in threads + late_threads:
            t.join(120)
        wait_for(lambda: server.stats()["deadline_exceeded"] - before_stats["deadline_exceeded"] == 3, 10, "3 dropped")
        after_stats = server.stats()
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3
    assert results == [(16, 64)] * count, results
    assert after_stats["requests"] - before_stats["requests"] == count  # only the slow requests reached the model
    assert after_stats["model_calls"] - before_stats["model_calls"] == count
    report("deadlines", before, after, served)
    assert after - before < 200


def test_message_above_the_max_receive_size_is_refused(base_path, expected):
    """gRPC's max receive size is max_message_bytes (1 MiB here): 20 messages of 2 MiB are RESOURCE_EXHAUSTED
    before the server reads them."""
    server = start_server(base_path, rest_api_port=None, max_message_bytes=1 << 20)
    try:
        assert_serves(server, expected)
        before = rss_mib()
        start = time.monotonic()
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            for _ in range(20):
                with pytest.raises(ServingError) as info:
                    c.embed(["x" * (2 << 20)])
                assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in info.value.details, info.value.details
        refused = (time.monotonic() - start) / 20
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    print(f"\n[max receive] {refused:.3f} s per refused message")
    report("max receive size", before, after, served)
    assert after - before < 100  # this process also holds the client's 2 MiB requests
