"""elmo_tf/serving/manager.py with real embedded servers on 127.0.0.1: a new version exported into the base path
while clients run is picked up with zero failed requests, an old version is kept until its requests end, a broken
version never replaces a good one, a failed load is retried and a slow copy loads once complete (issue 12, item 7),
and no status or error message shows the server's paths (item 9). RSS growth is printed (`pytest -s`) and bounded.
"""

import logging
import os
import shutil
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from serving_testlib import (
    VALID,
    assert_parity,
    assert_serves,
    copy_version,
    ex,
    make_model,
    messages,
    reference_sentences,
    report,
    rss_mib,
    start_server,
    statuses,
    wait_for,
)
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from elmo_tf.saved_model.warmup import warmup_path, write_warmup_requests
from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.manager import State
from elmo_tf.serving.serving_error import ServingError

SENTENCES = ["The cat sat on the mat .", "Dogs bark", ""]


def test_new_version_while_clients_run(fresh_base, model):
    server = start_server(fresh_base, file_system_poll_wait_seconds=0.2)
    model_v2 = make_model(1)
    expected = {1: reference_sentences(model, SENTENCES), 2: reference_sentences(model_v2, SENTENCES)}
    assert np.abs(expected[1]["elmo"] - expected[2]["elmo"]).max() > 1e-3  # the versions are told apart
    stop = threading.Event()
    failures, served = [], []

    def client_loop(k):
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=60, max_retries=0) as c:
            while not stop.is_set():
                try:
                    sent = time.monotonic()
                    out = c.embed(SENTENCES)
                    assert_parity(expected[out.model_version], out)
                    served.append((k, sent, out.model_version))
                except Exception as e:  # any failure counts, wrong numbers included
                    failures.append(f"client {k}: {type(e).__name__}: {e}")
                    return

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: len(served) >= 8, 60, "answers from version 1")
        ex.export_elmo(model_v2, fresh_base)  # version 2, written to a hidden directory and renamed into place
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo") as c:
            wait_for(
                lambda: (
                    c.model_status()[0] == {"version": 2, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}
                ),
                60,
                "version 2 AVAILABLE",
            )
            swapped = time.monotonic()  # every request sent from now on must be answered by version 2
            count = len(served)
            wait_for(lambda: len(served) >= count + 8 or failures, 60, "answers after the swap")
            wait_for(lambda: [s["state"] for s in c.model_status()] == ["AVAILABLE", "END"], 30, "version 1 END")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        server.stop(grace=1.0)
    assert not failures, failures
    versions = [v for _, _, v in served]
    assert versions[0] == 1 and versions[-1] == 2
    assert [v for _, sent, v in served if sent > swapped] and all(v == 2 for _, sent, v in served if sent > swapped), (
        "a request sent after version 2 became AVAILABLE was answered by version 1"
    )
    for k in range(4):  # per client, versions never go back (requests in flight at the swap may end on 1)
        mine = [v for client, _, v in served if client == k]
        assert mine == sorted(mine), f"client {k} went back to version 1: {mine}"


@pytest.mark.slow
def test_old_version_kept_until_its_requests_end(fresh_base, model):
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.2)
    manager = server.core.managers["elmo"]

    def states():
        return {s.version: State.Name(s.state) for s in manager.status().model_version_status}

    try:
        with manager.acquire() as old:  # an in-flight request on version 1
            ex.export_elmo(make_model(2), fresh_base)
            wait_for(lambda: manager.served_version == 2, 60, "version 2 served")
            assert states() == {2: "AVAILABLE", 1: "UNLOADING"}
            time.sleep(0.5)
            assert states()[1] == "UNLOADING" and old.runners is not None  # kept while the request holds it
            out = old.runner("default").run({"sentences": np.array([b"still on one"], object)})
            assert_parity(reference_sentences(model, ["still on one"]), out)
        wait_for(lambda: states() == {2: "AVAILABLE", 1: "END"}, 30, "version 1 END after its request")
    finally:
        server.stop(grace=1.0)


def test_broken_version_is_reported_and_not_served(fresh_base, model):
    server = start_server(
        fresh_base,
        rest_api_port=None,
        file_system_poll_wait_seconds=0.1,
        max_num_load_retries=1,
        load_retry_interval_micros=100_000,
    )
    try:
        broken = os.path.join(fresh_base, "7")
        os.makedirs(broken)
        with open(os.path.join(broken, "saved_model.pb"), "wb") as f:
            f.write(b"not a SavedModel")
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo") as c:
            wait_for(
                lambda: any(s["version"] == 7 and s["state"] == "END" for s in c.model_status()),
                30,
                "version 7 END with an error",
            )
            status = {s["version"]: s for s in c.model_status()}
            assert status[7]["error_code"] != "OK" and status[7]["error_message"]
            assert status[1]["state"] == "AVAILABLE"
            out = c.embed(SENTENCES)
            assert out.model_version == 1
            assert_parity(reference_sentences(model, SENTENCES), out)
    finally:
        server.stop(grace=1.0)


@pytest.mark.slow
def test_failed_load_is_retried_and_a_slow_copy_loads_once_complete(fresh_base, expected, caplog):
    """Item 7: retries gave up after ~6 s, leaving a slowly copied model END forever. Now a version whose copy is
    under way (saved_model.pb there, its variables not yet) is retried `load_retry_interval_micros` apart,
    `max_num_load_retries` times, while version 1 serves every request; after the last retry it is not tried again
    until its files change, and it loads once the copy is complete."""
    caplog.set_level(logging.INFO, logger="elmo_tf.serving")
    server = start_server(
        fresh_base,
        rest_api_port=None,
        file_system_poll_wait_seconds=0.05,
        max_num_load_retries=2,
        load_retry_interval_micros=200_000,
    )
    manager = server.core.managers["elmo"]
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


def stage_version(base, name, change):
    """Version `name` under `base`: a copy of version 1 changed by `change(directory)` beside the base, then renamed
    into place (the server never sees it half-changed)."""
    stage = os.path.join(os.path.dirname(base), f"stage-{name}")
    shutil.copytree(os.path.join(base, "1"), stage)
    change(stage)
    os.rename(stage, os.path.join(base, name))


def test_a_version_whose_warmup_file_fails_is_refused_and_the_old_one_keeps_serving(fresh_base, expected):
    """TF Serving fails the load of a version whose warmup file it cannot replay (saved_model_warmup_util.cc: not
    TFRecord -> DATA_LOSS "... Please verify your warmup data is in TFRecord format."; a request that fails -> that
    request's status) and keeps serving the version it had (aspired_versions_manager: a failed load never unloads)."""
    server = start_server(
        fresh_base,
        rest_api_port=None,
        file_system_poll_wait_seconds=0.1,
        max_num_load_retries=0,
    )

    def corrupt(directory):
        with open(warmup_path(directory), "r+b") as f:
            f.seek(5)
            f.write(b"\x00garbage\x00")

    def unknown_signature(directory):
        write_warmup_requests(directory, [("nosuch", {"sentences": np.array([b"a b"], object)})])

    try:
        assert_serves(server, expected)
        stage_version(fresh_base, "2", corrupt)
        stage_version(fresh_base, "3", unknown_signature)
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10) as c:
            wait_for(lambda: statuses(c) == [(3, "END"), (2, "END"), (1, "AVAILABLE")], 60, "versions 2 and 3 refused")
            status = {s["version"]: s for s in c.model_status()}
        assert status[2]["error_code"] == "DATA_LOSS", status[2]
        assert "Please verify your warmup data is in TFRecord format." in status[2]["error_message"]
        assert fresh_base not in status[2]["error_message"]  # the path is redacted
        assert status[3]["error_code"] != "OK"
        assert 'Serving signature key "nosuch" not found.' in status[3]["error_message"], status[3]
        assert_serves(server, expected, version=1)
    finally:
        server.stop(grace=1.0)


def test_with_model_warmup_off_a_version_whose_warmup_request_fails_loads_and_serves(fresh_base, expected):
    """Issue 27: --enable_model_warmup=false was ignored. Stock sets session_bundle_config.enable_model_warmup from the
    flag (Server::BuildAndStart in server.cc) and replays the warmup file only when it is on
    (saved_model_bundle_source_adapter.cc GetServableCreator): off, a version whose warmup file holds a failing request
    loads, and its first Predict is answered correctly; on (the default), the same version fails to load."""
    write_warmup_requests(os.path.join(fresh_base, "1"), [("nosuch", {"sentences": np.array([b"a b"], object)})])
    server = start_server(fresh_base, rest_api_port=None, enable_model_warmup=False)
    try:
        assert server.core.managers["elmo"].served_version == 1
        assert_serves(server, expected)
    finally:
        server.stop(grace=1.0)
    server = start_server(fresh_base, rest_api_port=None, max_num_load_retries=0)
    try:
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10) as c:
            (status,) = c.model_status()
        assert (status["version"], status["state"]) == (1, "END"), status
        assert 'Serving signature key "nosuch" not found.' in status["error_message"]
    finally:
        server.stop(grace=1.0)


def test_a_version_whose_files_change_while_it_loads_is_not_served_until_it_loads_whole(fresh_base, monkeypatch):
    """Hostile review (s12): a version directory rewritten while it loaded (its SavedModel read from one copy, its
    variables or warmup file from the next) was served as loaded. Its files' fingerprint is taken before and after the
    load: a change fails that load (UNAVAILABLE, "changed while it loaded") and the next poll loads it again."""
    from elmo_tf.serving import manager as manager_module
    from elmo_tf.serving.batching.scheduler import BatchStats
    from elmo_tf.serving.options import ServerOptions

    load = manager_module.load_servable
    loads = []

    def load_then_change(name, version, path, limits=None, **kwargs):
        servable = load(name, version, path, limits, **kwargs)
        loads.append(version)
        if len(loads) == 1:  # another copy lands while the first load runs
            with open(os.path.join(path, "assets.extra", "late_file"), "w") as f:
                f.write("written during the load")
        return servable

    monkeypatch.setattr(manager_module, "load_servable", load_then_change)
    options = ServerOptions(port=0, enable_batching=False, load_retry_interval_micros=0)
    manager = manager_module.ModelManager("elmo", fresh_base, options, BatchStats())
    manager.poll()
    assert manager.served_version is None
    state, code, message = manager._states[1]
    assert (state, code) == (State.START, grpc.StatusCode.UNAVAILABLE) and "changed while it loaded" in message
    manager.poll()
    assert loads == [1, 1] and manager.served_version == 1
