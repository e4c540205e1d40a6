"""The server core: models by name (a `manager.ModelManager` each) and the calls both fronts make (`predict`,
`model_status`, `model_metadata`, `infer`, `multi_inference`, `stats`), as TF Serving's ServerCore; a model spec is
checked as its `ServableRequestFromModelSpec` checks it, a version label resolved to its version
(`resolve`). `grpc_front` and `rest_front` are thin layers over a `ServerCore`; `server.ModelServer` holds one with
its fronts.

Models: each has a base path, a version policy and version labels (`config_files.ModelConfig`); the labels are taken
as stock takes them at start-up (`config_files.check_version_labels`: refused unless
`allow_version_labels_for_unavailable_models`).

Requests: `predict` runs at most `max_requests_in_flight` requests at once over both fronts; past that a request is
answered RESOURCE_EXHAUSTED at once. A deadline that has passed is answered DEADLINE_EXCEEDED without running
the model; the batch scheduler drops requests whose deadline passes while they are queued. Inputs are read by the
front's decoder against the signature's request budget (`budget.RequestBudget`) before anything else is built from
them; the response's real size is checked after the call. Error messages never show the server's paths.
"""

import logging
import os
import threading
import time

import grpc
from tensorflow_serving.apis import get_model_metadata_pb2

from elmo_tf.serving.admission import RequestAdmission
from elmo_tf.serving.batching.scheduler import BatchStats
from elmo_tf.serving.config_files import check_version_labels, model_config, models_of_config
from elmo_tf.serving.inference_checks import check_inference, check_multi_inference
from elmo_tf.serving.limits.budget import check_response_size
from elmo_tf.serving.manager import ModelManager, servable_request
from elmo_tf.serving.metrics import ServerMetrics
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.serving_error import (
    SIGNATURE_DEF_FIELD,
    ServingError,
    invalid_argument,
    not_found,
)

logger = logging.getLogger(__name__)

NO_DEADLINE = 1e6  # seconds; longer timeouts (gRPC's "no deadline" is ~9.2e18 s) mean none


class ServerCore(RequestAdmission):
    """Models by name (a `ModelManager` each) and the calls of the gRPC and REST fronts.

    Args:
        models: `{model_name: base_path or config_files.ModelConfig}` (a base path: latest 1, no labels).
        options: `ServerOptions`.
    Raises:
        ValueError: no models, or version labels stock refuses at start-up (`config_files.check_version_labels`).
    """

    def __init__(self, models, options=None):
        if not models:
            raise ValueError("models must name at least one {model_name: base_path}")
        self.options = options or ServerOptions()
        configs = [model_config(name, value) for name, value in models.items()]
        self._labels = check_version_labels(configs, self.options.allow_version_labels_for_unavailable_models)
        self.batch_stats = BatchStats()
        self.metrics = ServerMetrics(self)  # Prometheus (elmo_tf.serving.metrics), scraped over REST when enabled
        self.managers = {
            c.name: ModelManager(c.name, c.base_path, self.options, self.batch_stats, c.version_policy, self.metrics)
            for c in configs
        }
        RequestAdmission.__init__(self)
        self._reload_lock = threading.Lock()  # one config reload at a time

    def reload(self, models):
        """Serves `models` (`{name: base_path or ModelConfig}`) from now on, as stock's ServerCore::ReloadConfig
        (server_core.cc `ServerCore::ReloadConfig`): a model named before keeps its loaded versions when its base path
        and version policy are the same (its version labels are replaced); a new one, or one whose base path or policy
        changed, gets a new manager whose versions load before this returns; one no longer named stops taking requests
        now and unloads once its requests in flight are answered (`ModelManager.retire`). Version labels are checked as
        stock's UpdateModelVersionLabelMap checks them: each must name an AVAILABLE version unless
        `allow_version_labels_for_unavailable_models`. Raises ValueError (the config is refused whole, nothing
        changes) for no models or a label stock refuses."""
        configs = [model_config(name, value) for name, value in models.items()]
        if not configs:
            raise ValueError("models must name at least one {model_name: base_path}")
        with self._reload_lock:
            old = dict(self.managers)
            labels = check_version_labels(
                configs,
                self.options.allow_version_labels_for_unavailable_models,
                available=lambda name, version: name in old and version in old[name].available_versions(),
            )
            managers, started = {}, []
            for config in configs:
                manager = old.get(config.name)
                same = (
                    manager is not None
                    and manager.source.base_path == os.path.abspath(config.base_path)
                    and manager.source.policy == config.version_policy
                )
                if not same:
                    manager = ModelManager(
                        config.name,
                        config.base_path,
                        self.options,
                        self.batch_stats,
                        config.version_policy,
                        self.metrics,
                    )
                    manager.poll()
                    started.append(manager)
                managers[config.name] = manager
            self.managers, self._labels = managers, labels  # one assignment each: requests see old or new
            for manager in started:
                manager.start_polling()
            for name, manager in old.items():
                if managers.get(name) is not manager:
                    manager.retire()
            logger.info("serving models %s (config reloaded)", sorted(managers))

    def reload_config(self, config):
        """`HandleReloadConfigRequest` (model_service_impl.cc): `reload` with a ModelServerConfig message; the
        outcome is in the ReloadConfigResponse's status (the call itself succeeds, as stock's), OK or the error that
        kept the old config: INVALID_ARGUMENT for a config stock refuses, FAILED_PRECONDITION for a label."""
        from tensorflow_serving.apis import model_management_pb2

        response = model_management_pb2.ReloadConfigResponse()
        try:
            self.reload(models_of_config(config))
        except ValueError as e:
            code = grpc.StatusCode.FAILED_PRECONDITION if "assign label" in str(e) else grpc.StatusCode.INVALID_ARGUMENT
            response.status.error_code = code.value[0]
            response.status.error_message = str(e)
            logger.error("ReloadConfig failed: %s", e)
        return response

    def poll(self):
        """One look at every base path (`ModelManager.poll`): the first versions load here."""
        for manager in self.managers.values():
            manager.poll()

    def start_polling(self):
        """Polls every base path every `file_system_poll_wait_seconds` from now on."""
        for manager in self.managers.values():
            manager.start_polling()

    def stop(self, timeout=None):
        """Stops polling and the model threads (batch schedulers), waiting up to `timeout` seconds for each."""
        for manager in self.managers.values():
            manager.stop(timeout)

    def stats(self):
        """Batching counters (`BatchStats.snapshot()`), the served version of each model, the Predict requests in
        flight, and those refused at the in-flight cap (`rejected_in_flight`), past their deadline
        (`deadline_exceeded`) or while draining (`rejected_draining`)."""
        with self._lock:
            counters, in_flight = dict(self._counters), self._in_flight_count
        return {
            **self.batch_stats.snapshot(),
            "served_versions": {name: m.served_version for name, m in self.managers.items()},
            "in_flight": in_flight,
            "rejected_in_flight": counters.get("rejected_in_flight", 0),
            "deadline_exceeded": counters.get("deadline_exceeded", 0),
            "rejected_draining": counters.get("rejected_draining", 0),
            "refused_by_budget": {key[len("budget:") :]: n for key, n in counters.items() if key.startswith("budget:")},
        }

    def resolve(self, name, version=None, label=None):
        """`(ModelManager, version)` of a model spec, checked as TF Serving's `ServerCore::ServableRequestFromModelSpec`
        (server_core.cc) checks it: INVALID_ARGUMENT for an empty name; a version label is resolved to its version by
        the model's version_labels (`ServerCore::GetModelVersionForLabel`: INVALID_ARGUMENT "Unrecognized servable
        version label: x" for a label the model does not have, an unknown model included); NOT_FOUND (basic_manager.cc
        `BasicManager::ServingMap::GetUntypedServableHandle`) for a model this server does not serve. The version
        (None: the highest AVAILABLE) is looked up by `ModelManager.acquire`."""
        if not name:
            raise invalid_argument("ModelSpec has no name specified.")
        if label:
            version = self._labels.get(name, {}).get(label)
            if version is None:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(f"Servable not found for request: {servable_request(name, version)}")
        return manager, version

    def predict(
        self,
        name,
        version,
        signature_name,
        decode_inputs,
        output_filter=(),
        timeout=None,
        cancelled=None,
        response_encoding="proto",
        label=None,
        signature_not_found=None,
    ):
        """Runs one request; returns (version, signature name, outputs alias -> array) in `output_filter` order.

        Args:
            decode_inputs: callable `budget -> {alias: array}` that reads the transport's inputs against the
                signature's `budget.RequestBudget` (TensorProtos for gRPC, JSON for REST), raising `ServingError` on
                bad input.
            timeout: seconds left before the client's deadline, None for none. A request whose deadline passes
                before the model runs is not run (DEADLINE_EXCEEDED).
            cancelled: optional callable, True when the client went away.
            response_encoding: "proto" or "json", how the response will be written (its size estimate differs).
            label: the model spec's version label, resolved to its version (`resolve`).
            signature_not_found: callable `name -> ServingError` for an unknown signature (REST and gRPC answer
                differently); gRPC's FAILED_PRECONDITION by default.
        Raises:
            ServingError: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED (request budget,
                in-flight cap), DEADLINE_EXCEEDED; messages without the server's paths.
        """
        deadline = time.monotonic() + timeout if timeout is not None and timeout < NO_DEADLINE else None
        manager, version = self.resolve(name, version, label)
        with self._client_errors(manager):
            self._check_deadline(deadline, "before the server started on it")
            with self._in_flight(), manager.acquire(version) as servable:
                runner = servable.runner(signature_name, signature_not_found)
                inputs = decode_inputs(runner.budget)
                request = runner.budget.prepare(inputs, output_filter, response_encoding=response_encoding)
                self._check_deadline(deadline, "before the model ran")
                started = time.monotonic()
                outputs = self._run(servable, runner, request, deadline, cancelled)
                self.metrics.record_runtime(name, "Predict", time.monotonic() - started)
                self.metrics.record_tokens(name, request.tokens)
                outputs = {alias: outputs[alias] for alias in request.output_filter}
                check_response_size(outputs, self.options.max_message_bytes)
                return servable.version, runner.name, outputs

    def _run(self, servable, runner, request, deadline, cancelled):
        """The outputs of `request`: through the version's batch scheduler when it has one, else one call."""
        if servable.scheduler is not None:
            left = deadline - time.monotonic() if deadline is not None else None
            return servable.scheduler.submit(runner, request, left, cancelled)
        outputs = runner.run_one(request)
        self.batch_stats.record_call(servable.model_name, runner.name, 1, request.batch)
        if isinstance(outputs, ServingError):
            raise outputs
        return outputs

    def infer(self, name, version, label, method, signature_name):
        """Classify or Regress (`method`): checked as stock checks it (`inference_checks.check_inference`); raises."""
        manager, version = self.resolve(name, version, label)
        with self._client_errors(manager), manager.acquire(version) as servable:
            check_inference(servable.signature_defs, method, signature_name)

    def multi_inference(self, tasks):
        """MultiInference: the first task's model spec names the servable (an empty one when there are no tasks,
        multi_inference_helper.cc `GetModelSpecFromRequest`), then `inference_checks.check_multi_inference`; raises."""
        spec = tasks[0].model_spec if tasks and tasks[0].HasField("model_spec") else None
        name = spec.name if spec is not None else ""
        version = spec.version.value if spec is not None and spec.HasField("version") else None
        label = spec.version_label if spec is not None else None
        manager, version = self.resolve(name, version, label)
        with self._client_errors(manager), manager.acquire(version) as servable:
            check_multi_inference(servable.signature_defs, tasks)

    def model_status(self, name, version=None):
        """A `GetModelStatusResponse` of model `name` (NOT_FOUND for an unknown model or version). Version labels
        play no part: TF Serving's GetModelStatusImpl::GetModelStatusWithModelSpec (get_model_status_impl.cc) looks at a
        version number only."""
        manager = self.managers.get(name)
        if manager is None:
            if version is not None:
                raise not_found(f"Could not find version {version} of model {name}")
            raise not_found(f"Could not find any versions of model {name}")
        return manager.status(version)

    def model_metadata(self, name, version=None, label=None):
        """A `GetModelMetadataResponse` with `metadata["signature_def"]` = the version's `SignatureDefMap`."""
        manager, version = self.resolve(name, version, label)
        with manager.acquire(version) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature_def in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(signature_def)
            response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
            return response
