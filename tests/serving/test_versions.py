"""Version handling of serving/server.py: a new version exported into the base path while clients run is picked up
with zero failed requests, an old version is kept until its requests end, a broken version never replaces a good
one."""

import os
import threading
import time

import numpy as np
from serving_testlib import assert_parity, ex, make_model, reference_sentences, start_server, wait_for

from serving.client import ElmoClient
from serving.registry import State

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


def test_old_version_kept_until_its_requests_end(fresh_base, model):
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.2)
    manager = server.managers["elmo"]

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
