"""Config reload without a restart (elmo_tf/serving/core.py `reload`, `HandleReloadConfigRequest`,
`--model_config_file_poll_wait_seconds`), with real servers on 127.0.0.1 and real clients: models added, removed and
re-pointed while a load runs on the models that stay (0 failed requests), a removed model answering what it had in
flight, a config stock refuses kept out (the old one stays), as stock's ServerCore::ReloadConfig and
model_service_impl.cc (HandleReloadConfigRequest: the outcome in the response's status) do."""

import threading
import time

import grpc
import pytest
from serving_testlib import free_port, kill_if_running, serve_embedded, start_server, stop_with_sigterm, wait_for
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.serving_error import ServingError


def config_of(models, labels=None):
    config = model_server_config_pb2.ModelServerConfig()
    for name, base in models.items():
        entry = config.model_config_list.config.add(name=name, base_path=str(base), model_platform="tensorflow")
        for label, version in (labels or {}).get(name, {}).items():
            entry.version_labels[label] = version
    return config


def reload(port, config):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        return stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=120)


class Load:
    """Requests to one model in a loop on a thread until stopped; counts answers and failures."""

    def __init__(self, port, model):
        self.port, self.model = port, model
        self.ok, self.failed = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with ElmoClient(f"127.0.0.1:{self.port}", self.model, timeout=60, max_retries=0) as c:
            while not self._stop.is_set():
                try:
                    c.embed(["a steady load"], output_filter=["default"])
                    self.ok += 1
                except ServingError as e:
                    self.failed.append(e)

    def __enter__(self):
        self._thread.start()
        wait_for(lambda: self.ok >= 3 or self.failed, 60, f"the load on {self.model} to run")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)


def served(port, model):
    with ElmoClient(f"127.0.0.1:{port}", model, timeout=60, max_retries=0) as c:
        try:
            return c.embed(["is it served"], output_filter=["default"])["default"].shape == (1, 64)
        except ServingError as e:
            return e.code


def test_models_are_added_and_removed_under_load_and_a_refused_config_changes_nothing(base_path):
    server = start_server(base_path, rest_api_port=None)
    port = server.grpc_port
    try:
        with Load(port, "elmo") as load:
            response = reload(port, config_of({"elmo": base_path, "second": base_path}))
            assert response.status.error_code == 0, response
            assert served(port, "second") is True
            assert load.failed == [] and load.ok > 0  # the model that stayed never failed
        with Load(port, "second") as load:
            response = reload(port, config_of({"second": base_path}))
            assert response.status.error_code == 0, response
            wait_for(lambda: served(port, "elmo") == grpc.StatusCode.NOT_FOUND, 30, "elmo removed")
            # refused whole: a relative base path (ValidateModelConfigList) and a label of no AVAILABLE version
            bad = reload(port, config_of({"second": base_path, "third": "relative/path"}))
            assert bad.status.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert "Expected model third to have an absolute path" in bad.status.error_message
            labelled = reload(port, config_of({"second": base_path}, labels={"second": {"canary": 7}}))
            assert labelled.status.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
            assert "Request to assign label to version 7 of model second" in labelled.status.error_message
            assert load.failed == [] and load.ok > 0
        assert sorted(server.core.managers) == ["second"]
        good = reload(port, config_of({"second": base_path}, labels={"second": {"stable": 1}}))
        assert good.status.error_code == 0, good
        with ElmoClient(f"127.0.0.1:{port}", "second", timeout=60, max_retries=0) as c:
            assert c.model_status()  # the label's version is served
        assert server.core.resolve("second", label="stable")[1] == 1
    finally:
        server.stop(0)


def test_a_removed_model_answers_what_it_has_in_flight(base_path):
    server = start_server(base_path, rest_api_port=None)
    port = server.grpc_port
    slow = [" ".join(f"w{i % 50}" for i in range(300))] * 16
    results = []

    def slow_request():
        with ElmoClient(f"127.0.0.1:{port}", "elmo", timeout=120, max_retries=0) as c:
            try:
                results.append(c.embed(slow, output_filter=["default"])["default"].shape)
            except ServingError as e:
                results.append(e)

    try:
        threads = [threading.Thread(target=slow_request) for _ in range(8)]
        for t in threads:
            t.start()
        wait_for(lambda: server.core.stats()["in_flight"] == 8, 60, "8 slow requests in flight")
        assert reload(port, config_of({"other": base_path})).status.error_code == 0
        for t in threads:
            t.join(120)
        assert results == [(16, 64)] * 8
        assert served(port, "elmo") == grpc.StatusCode.NOT_FOUND and served(port, "other") is True
    finally:
        server.stop(0)


@pytest.mark.slow
def test_serve_polls_its_model_config_file(base_path, tmp_path):
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "elmo" base_path: "{base_path}" }} }}\n')
    port = free_port()
    process = serve_embedded(
        "--port",
        port,
        "--rest_api_port",
        "0",
        "--model_config_file",
        config,
        "--model_config_file_poll_wait_seconds",
        1,
    )
    try:
        wait_for(lambda: served(port, "elmo") is True, 120, "elmo served")
        with Load(port, "elmo") as load:
            staged = tmp_path / ".models.config"
            staged.write_text(
                f'model_config_list {{ config {{ name: "elmo" base_path: "{base_path}" }}\n'
                f'  config {{ name: "second" base_path: "{base_path}" }} }}\n'
            )
            staged.rename(config)  # replaced whole, as an editor or a ConfigMap update does
            wait_for(lambda: served(port, "second") is True, 60, "second served after the edit")
            config.write_text("model_config_list { config { name: 'elmo' base_path: 'relative' }\n")  # broken
            time.sleep(2.5)  # two polls
            assert served(port, "elmo") is True and served(port, "second") is True  # the last good config
            assert load.failed == [] and load.ok > 0
        output = stop_with_sigterm(process, timeout=120)
    finally:
        kill_if_running(process)
    assert process.returncode == 0, output
    assert "serving models ['elmo', 'second'] (config reloaded)" in output
    assert "--model_config_file: cannot parse" in output and "still serving ['elmo', 'second']" in output
