"""Draining and the gRPC health service (elmo_tf/serving/server.py `drain`, `--enable_grpc_healthcheck_service`,
`--drain_grace_seconds`), with real servers on 127.0.0.1 and real clients: the standard grpc.health.v1 stub (what
grpc_health_probe and Kubernetes' gRPC probes call) sees NOT_SERVING before the first version, SERVING once it
loads, NOT_SERVING while draining; draining answers every request in flight while new gRPC calls are refused
UNAVAILABLE and REST requests 503; SIGTERM drains `serving/serve.py` and it exits 0.

Stock names the services "ModelService" and "PredictionService" (Server::BuildAndStart in
tensorflow_serving/model_servers/server.cc: `EnableDefaultHealthCheckService` + `SetServingStatus`), beside gRPC's
overall "".
"""

import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from serving_testlib import free_port, kill_if_running, serve_embedded, start_server, wait_for

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.serving_error import ServingError

SERVICES = ("", "ModelService", "PredictionService")
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SLOW = [" ".join(f"w{i % 50}" for i in range(300))] * 16  # a few tenths of a second of the model per request


def health(target):
    """{service: status} through the standard health stub."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {s: stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=10).status for s in SERVICES}


def slow_request(target, results):
    with ElmoClient(target, "elmo", timeout=120, max_retries=0) as c:
        try:
            results.append(c.embed(SLOW, output_filter=["default"])["default"].shape)
        except Exception as e:
            results.append(f"{type(e).__name__}: {e}")


def rest_predict(port):
    body = json.dumps({"signature_name": "default", "instances": ["a new request"]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/elmo:predict", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_health_follows_the_first_version_then_draining_answers_what_is_in_flight(base_path, tmp_path):
    base = str(tmp_path / "elmo")
    os.makedirs(base)  # no version yet
    server = start_server(
        base, enable_grpc_healthcheck_service=True, file_system_poll_wait_seconds=0.05, max_requests_in_flight=64
    )
    target = f"127.0.0.1:{server.grpc_port}"
    try:
        assert health(target) == dict.fromkeys(SERVICES, NOT_SERVING)  # listening, nothing to serve yet
        shutil.copytree(os.path.join(base_path, "1"), os.path.join(base, ".staged"))
        os.rename(os.path.join(base, ".staged"), os.path.join(base, "1"))  # whole, as an export publishes it
        wait_for(lambda: health(target) == dict.fromkeys(SERVICES, SERVING), 60, "SERVING once version 1 loads")

        results = []
        threads = [threading.Thread(target=slow_request, args=(target, results)) for _ in range(32)]
        for t in threads:
            t.start()
        wait_for(lambda: server.core.stats()["in_flight"] == 32, 60, "32 slow requests in flight")
        drained = []
        drainer = threading.Thread(target=lambda: drained.append(server.drain(120)))
        drainer.start()
        wait_for(lambda: server.core.draining, 10, "the drain to start")

        assert health(target) == dict.fromkeys(SERVICES, NOT_SERVING)
        with ElmoClient(target, "elmo", timeout=30, max_retries=0) as c:
            try:
                c.embed(["a new request"])
                refused = None
            except ServingError as e:
                refused = e
        assert refused is not None and refused.code == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in refused.details
        status, body = rest_predict(server.rest_port)
        assert status == 503 and "shutting down" in body["error"]
        assert server.core.stats()["in_flight"] > 0  # the refusals came while the slow ones still ran

        drainer.join(120)
        for t in threads:
            t.join(120)
        assert drained == [True]
        assert results == [(16, 64)] * 32  # every request in flight was answered
        assert server.core.stats()["rejected_draining"] >= 1
    finally:
        server.stop(0)


def test_drain_gives_up_at_its_grace_and_the_health_service_is_off_by_default(base_path):
    server = start_server(base_path)
    target = f"127.0.0.1:{server.grpc_port}"
    try:
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                code = None
            except grpc.RpcError as e:
                code = e.code()
        assert code == grpc.StatusCode.UNIMPLEMENTED  # as stock without --enable_grpc_healthcheck_service
        results = []
        threads = [threading.Thread(target=slow_request, args=(target, results)) for _ in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: server.core.stats()["in_flight"] == 4, 60, "4 slow requests in flight")
        start = time.monotonic()
        assert server.drain(0.0) is False  # no grace: returns at once with requests still in flight
        assert time.monotonic() - start < 2.0
        for t in threads:
            t.join(120)
    finally:
        server.stop(0)


def test_sigterm_drains_32_slow_requests_refuses_new_ones_and_exits_0(base_path, tmp_path):
    port, rest_port = free_port(), free_port()
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    process = serve_embedded(
        *("--model_base_path", base_path, "--model_name", "elmo", "--port", port, "--rest_api_port", rest_port),
        *("--enable_grpc_healthcheck_service", "--drain_grace_seconds", 120, "--max_requests_in_flight", 64),
        *("--num_batch_threads", 1, "--monitoring_config_file", monitoring),
    )
    target = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(target), 120, "the served model SERVING")
        statuses, watching = [], threading.Event()
        watcher = threading.Thread(target=_watch_health, args=(target, statuses, watching), daemon=True)
        watcher.start()
        assert watching.wait(30), "the health Watch stream did not answer"
        results = []
        threads = [threading.Thread(target=slow_request, args=(target, results)) for _ in range(32)]
        for t in threads:
            t.start()
        # SIGTERM only once the server holds every one of the 32 (its own gauge), so the drain has work to wait for
        # however slowly this machine started the client threads: one batch thread answers a few per half second
        wait_for(lambda: _in_flight(rest_port) + len(results) == 32, 120, "the 32 requests admitted")
        in_flight = _in_flight(rest_port)
        assert in_flight >= 8, f"only {in_flight} of the 32 requests left before SIGTERM: make them slower"
        process.send_signal(signal.SIGTERM)
        refusal = _first_refusal(target)
        assert refusal is not None and refusal.code == grpc.StatusCode.UNAVAILABLE, refusal
        assert "shutting down" in refusal.details, refusal  # the drain's refusal, not a closed port
        watcher.join(120)
        # the standard Watch stream saw the drain turn the server NOT_SERVING while the port still answered
        assert statuses[0] == SERVING and statuses[-1] == NOT_SERVING, statuses
        for t in threads:
            t.join(120)
        output, _ = process.communicate(timeout=120)
    finally:
        kill_if_running(process)
    assert process.returncode == 0, output
    assert results == [(16, 64)] * 32, results  # all 32 answered
    assert "draining: new requests are refused" in output and "server stopped" in output
    assert "dropped" not in output


def _in_flight(rest_port):
    """The server's own count of Predict requests running or queued (its Prometheus gauge)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/metrics", timeout=30) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    return int(families["elmo_serving_requests_in_flight"].samples[0].value)


def _watch_health(target, statuses, watching):
    """Follows the overall service ("") on the standard health Watch stream until it turns NOT_SERVING."""
    with grpc.insecure_channel(target) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=300)
        try:
            for response in stream:
                statuses.append(response.status)
                watching.set()
                if response.status == NOT_SERVING:
                    return
        except grpc.RpcError:
            return


def _healthy(target):
    try:
        return health(target)[""] == SERVING
    except grpc.RpcError:
        return False


def _first_refusal(target, timeout=30.0):
    """Sends small requests until one is refused (the drain has begun); returns its ServingError."""
    end = time.monotonic() + timeout
    with ElmoClient(target, "elmo", timeout=30, max_retries=0) as c:
        while time.monotonic() < end:
            try:
                c.embed(["a probe"], output_filter=["default"])
            except ServingError as e:
                return e
            time.sleep(0.05)
    return None
