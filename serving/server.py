"""The embedded model server: TF Serving's gRPC API (and its REST API, `serving.rest`) for SavedModels, in Python.

Implements `tensorflow.serving.PredictionService` (`Predict`, `GetModelMetadata`; `Classify`, `Regress` and
`MultiInference` answer UNIMPLEMENTED) and `tensorflow.serving.ModelService.GetModelStatus`, with the request and
response protos of `tensorflow_serving.apis`, so TF Serving's clients work unchanged.

Versions (as TF Serving's default "latest" version policy): each model's base path holds integer version
directories; the highest one that holds a `saved_model.pb` is served. The base path is polled every
`file_system_poll_wait_seconds`; a new highest version is loaded (`tf.saved_model.load`, tensorflow-text's ops
registered first), every signature is run once (warm-up), and only then does it replace the served version.
Requests that started on the old version finish on it: the old version is unloaded when its last request ends
(GetModelStatus: LOADING -> AVAILABLE for the new version, UNLOADING -> END for the old one). A version that fails
to load is retried on the next polls, `max_num_load_retries` times, then reported END with its error while the
previous version stays served. Requests for another version than the served one answer NOT_FOUND, as TF Serving's.

Errors (gRPC status; REST maps them as TF Serving does, see `serving.status`):
    NOT_FOUND: unknown model name ("Servable not found for request: Latest(name)"), version
        ("... Specific(name, 7)"), or signature ("Serving signature key "x" not found."). Stock TF Serving answers
        an unknown signature with FAILED_PRECONDITION on gRPC (INVALID_ARGUMENT on REST); clients that talk to both
        should treat either as "no such signature".
    INVALID_ARGUMENT: inputs or outputs that do not match the SignatureDef (see `serving.servable`), or a graph
        error caused by the values (TensorFlow's message).
    RESOURCE_EXHAUSTED: a request above the size limits (see `serving.servable.Limits`) or above the gRPC
        message size (`max_message_bytes`, both directions; gRPC's own message), or more concurrent calls than
        the server queues (4 x `grpc_max_threads`).
    DEADLINE_EXCEEDED: the client's deadline passed while its request waited for the model.
    INTERNAL: a bug; logged with its traceback. No request error stops the server.

Concurrency: gRPC calls run on a pool of `grpc_max_threads` threads; with batching (on by default, see
`serving.batching`) `num_batch_threads` workers make the model calls, merging concurrent requests. Binds
127.0.0.1 unless `host` says otherwise.

Example:
    server = ModelServer({"elmo": "models/elmo"}, ServerOptions(port=0, rest_api_port=0)).start()
    print(server.grpc_port, server.rest_port)
    ...
    server.stop()
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import re
import threading

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.batching import BatchingOptions, BatchScheduler, BatchStats
from serving.servable import Limits, MiB, check_response_size, load_servable
from serving.status import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, not_found, status_code

logger = logging.getLogger("serving.server")

DEFAULT_MAX_MESSAGE_BYTES = 256 * MiB
State = get_model_status_pb2.ModelVersionStatus.State


@dataclasses.dataclass
class ServerOptions:
    """Settings of the embedded server (the CLI flags of `serving/serve.py`, TF Serving's names where it has one).

    Args:
        host: interface to bind, "127.0.0.1" (local only) by default; "0.0.0.0" for all.
        port: gRPC port; 0 picks a free one (see `ModelServer.grpc_port`).
        rest_api_port: REST port; None for no REST server, 0 picks a free one.
        enable_batching: merge concurrent requests (`serving.batching`).
        batching: `BatchingOptions` (max_batch_size, batch_timeout, num_threads).
        max_request_sentences, max_tokens_per_sentence: request limits (`serving.servable.Limits`).
        max_message_bytes: gRPC max send/receive message size, REST max body, and the response size limit.
        file_system_poll_wait_seconds: how often base paths are polled for new versions.
        max_num_load_retries: polls that retry a version that failed to load.
        grpc_max_threads: gRPC handler threads.
        rest_api_num_threads: REST handler threads (each keeps one client connection while it is open).
        rest_api_timeout_in_ms: REST request deadline.
    """

    host: str = "127.0.0.1"
    port: int = 8500
    rest_api_port: int = None
    enable_batching: bool = True
    batching: BatchingOptions = dataclasses.field(default_factory=BatchingOptions)
    max_request_sentences: int = Limits.max_request_sentences
    max_tokens_per_sentence: int = Limits.max_tokens_per_sentence
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    file_system_poll_wait_seconds: float = 1.0
    max_num_load_retries: int = 5
    grpc_max_threads: int = 64
    rest_api_num_threads: int = 32
    rest_api_timeout_in_ms: int = 30000

    def __post_init__(self):
        if not isinstance(self.max_message_bytes, int) or not 1 <= self.max_message_bytes < 2**31:
            raise ValueError(
                f"max_message_bytes must be in [1, 2**31 - 1] (a gRPC limit), got {self.max_message_bytes!r}"
            )
        if not self.file_system_poll_wait_seconds > 0:
            raise ValueError(f"file_system_poll_wait_seconds must be > 0, got {self.file_system_poll_wait_seconds!r}")
        for name in ("grpc_max_threads", "rest_api_num_threads", "rest_api_timeout_in_ms"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        _ = self.limits  # validates the request limits

    @property
    def limits(self):
        return Limits(self.max_request_sentences, self.max_tokens_per_sentence, self.max_message_bytes)


def versions_on_disk(base_path):
    """Integer version directories under `base_path` that hold a SavedModel, sorted (hidden temporaries skipped)."""
    try:
        names = os.listdir(base_path)
    except OSError:
        return []
    return sorted(
        int(name)
        for name in names
        if re.fullmatch(r"[0-9]+", name)
        and any(os.path.isfile(os.path.join(base_path, name, f)) for f in ("saved_model.pb", "saved_model.pbtxt"))
    )


def _servable_request(name, version):
    return f"Specific({name}, {version})" if version is not None else f"Latest({name})"


class ModelManager:
    """Serves the highest version under one model's base path; loads new versions and retires old ones.

    Args:
        name: the model name clients ask for.
        base_path: the directory holding `<version>/saved_model.pb`.
        options: `ServerOptions`.
        stats: `BatchStats`.
    """

    def __init__(self, name, base_path, options, stats):
        self.name = name
        self.base_path = os.path.abspath(base_path)
        self.options = options
        self.stats = stats
        self._lock = threading.Lock()
        self._current = None
        self._refs = collections.Counter()
        self._retiring = set()
        self._states = {}  # version -> (State, grpc.StatusCode, message)
        self._failures = collections.Counter()
        self._warned_empty = False
        self._stop = threading.Event()
        self._poller = None

    # ------------------------------------------------------------------------------------------------ versions

    def _set_state(self, version, state, code=grpc.StatusCode.OK, message=""):
        with self._lock:
            self._states[version] = (state, code, message)

    def poll(self):
        """Loads the highest version on disk when it is not the one served (and has not failed too often)."""
        versions = versions_on_disk(self.base_path)
        if not versions:
            if not self._warned_empty:
                logger.warning("No versions of servable %s found under base path %s", self.name, self.base_path)
                self._warned_empty = True
            return
        self._warned_empty = False
        target = versions[-1]
        current = self._current
        if current is not None and current.version == target:
            return
        if self._failures[target] > self.options.max_num_load_retries:
            return
        self._load(target)

    def _load(self, version):
        path = os.path.join(self.base_path, str(version))
        logger.info("loading %s version %d from %s", self.name, version, path)
        self._set_state(version, State.LOADING)
        try:
            servable = load_servable(self.name, version, path, self.options.limits)
        except Exception as e:
            self._failures[version] += 1
            code = status_code(e.error_code) if isinstance(e, tf.errors.OpError) else grpc.StatusCode.UNKNOWN
            message = f"{type(e).__name__}: {e}".split("\n")[0]
            final = self._failures[version] > self.options.max_num_load_retries
            logger.error(
                "loading %s version %d failed (attempt %d%s): %s",
                self.name,
                version,
                self._failures[version],
                ", giving up" if final else ", will retry",
                message,
            )
            self._set_state(version, State.END if final else State.START, code, message)
            return
        if self.options.enable_batching:
            servable.scheduler = BatchScheduler(self.options.batching, self.stats, self.name, version)
        with self._lock:
            old, self._current = self._current, servable
            self._states[version] = (State.AVAILABLE, grpc.StatusCode.OK, "")
            if old is not None:
                self._states[old.version] = (State.UNLOADING, grpc.StatusCode.OK, "")
                self._retiring.add(old)
                release_now = self._refs[old] == 0
        logger.info(
            "serving %s version %d%s",
            self.name,
            version,
            f" (replacing version {old.version})" if old is not None else "",
        )
        if old is not None and release_now:
            self._release(old)

    def _release(self, servable):
        def unload():
            if servable.scheduler is not None:
                servable.scheduler.stop()
            with self._lock:
                self._retiring.discard(servable)
                self._refs.pop(servable, None)
                if self._current is not servable:
                    self._states[servable.version] = (State.END, grpc.StatusCode.OK, "")
            servable.loaded = servable.runners = None
            logger.info("unloaded %s version %d", self.name, servable.version)

        threading.Thread(target=unload, name=f"unload-{self.name}-{servable.version}", daemon=True).start()

    def start_polling(self):
        def loop():
            while not self._stop.wait(self.options.file_system_poll_wait_seconds):
                try:
                    self.poll()
                except Exception:  # a poll must never end the loop
                    logger.exception("polling %s failed", self.base_path)

        self._poller = threading.Thread(target=loop, name=f"poll-{self.name}", daemon=True)
        self._poller.start()

    def stop(self, timeout=None):
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout)
        with self._lock:
            servables = [s for s in [self._current, *self._retiring] if s is not None]
        for servable in servables:
            if servable.scheduler is not None:
                servable.scheduler.stop(timeout)

    # ------------------------------------------------------------------------------------------------ requests

    @contextlib.contextmanager
    def acquire(self, version=None):
        """The served version (NOT_FOUND if `version` is given and differs), held until the block ends."""
        with self._lock:
            servable = self._current
            if servable is None or (version is not None and servable.version != version):
                served = f"; serving version {servable.version}" if servable is not None else "; no version loaded yet"
                raise not_found(f"Servable not found for request: {_servable_request(self.name, version)}{served}")
            self._refs[servable] += 1
        try:
            yield servable
        finally:
            with self._lock:
                self._refs[servable] -= 1
                release = servable in self._retiring and self._refs[servable] == 0
            if release:
                self._release(servable)

    @property
    def served_version(self):
        current = self._current
        return current.version if current is not None else None

    def status(self, version=None):
        """A `GetModelStatusResponse`: every version seen (highest first), or just `version`."""
        with self._lock:
            states = dict(self._states)
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {self.name}")
            states = {version: states[version]}
        elif not states:
            raise not_found(f"Could not find any versions of model {self.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for v in sorted(states, reverse=True):
            state, code, message = states[v]
            entry = response.model_version_status.add(version=v, state=state)
            entry.status.error_code = code.value[0]
            entry.status.error_message = message
        return response


class ModelServer:
    """The embedded server: models by name, their managers, the gRPC server and the optional REST server.

    Args:
        models: `{model_name: base_path}`.
        options: `ServerOptions`.
    """

    def __init__(self, models, options=None):
        if not models:
            raise ValueError("models must name at least one {model_name: base_path}")
        self.options = options or ServerOptions()
        self.batch_stats = BatchStats()
        self.managers = {
            name: ModelManager(name, path, self.options, self.batch_stats) for name, path in models.items()
        }
        self._grpc = None
        self._rest = None
        self.grpc_port = None
        self.rest_port = None

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self):
        """Loads each model's highest version, then listens (gRPC, and REST when `rest_api_port` is set)."""
        for manager in self.managers.values():
            manager.poll()
        self._start_grpc()
        if self.options.rest_api_port is not None:
            from serving.rest import RestServer

            self._rest = RestServer(
                self,
                self.options.host,
                self.options.rest_api_port,
                self.options.rest_api_num_threads,
                self.options.rest_api_timeout_in_ms / 1000.0,
                self.options.max_message_bytes,
            )
            self._rest.start()
            self.rest_port = self._rest.port
            logger.info("REST API listening on %s:%d", self.options.host, self.rest_port)
        for manager in self.managers.values():
            manager.start_polling()
        return self

    def _start_grpc(self):
        size = self.options.max_message_bytes
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=self.options.grpc_max_threads, thread_name_prefix="grpc"),
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=4 * self.options.grpc_max_threads,
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_PredictionServicer(self), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelServicer(self), server)
        host = self.options.host
        address = (
            f"[{host}]:{self.options.port}"
            if ":" in host and not host.startswith("[")
            else f"{host}:{self.options.port}"
        )
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {address} for gRPC: {e}") from None
        if not port:
            raise OSError(f"cannot listen on {address} for gRPC (port in use?)")
        server.start()
        self._grpc, self.grpc_port = server, port
        logger.info("gRPC API listening on %s:%d (max message %d bytes)", host, port, size)

    def stop(self, grace=5.0):
        """Stops accepting requests, lets running ones finish (up to `grace` seconds), stops the model threads."""
        stopped = self._grpc.stop(grace) if self._grpc is not None else None  # drains in the background
        if self._rest is not None:
            self._rest.stop(grace)
        if stopped is not None:
            stopped.wait(grace + 1.0)
        for manager in self.managers.values():
            manager.stop(grace)
        logger.info("server stopped")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def stats(self):
        """Batching counters (`BatchStats.snapshot()`) plus the served version of each model."""
        return {
            **self.batch_stats.snapshot(),
            "served_versions": {name: m.served_version for name, m in self.managers.items()},
        }

    # ------------------------------------------------------------------------------------------------ API

    def manager(self, name, version=None):
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(
                f"Servable not found for request: {_servable_request(name, version)}; "
                f"this server serves {sorted(self.managers)}"
            )
        return manager

    def predict(self, name, version, signature_name, decode_inputs, output_filter=(), timeout=None, cancelled=None):
        """Runs one request; returns (version, signature name, outputs alias -> array) in `output_filter` order.

        Args:
            decode_inputs: callable `runner -> {alias: array}` that reads the transport's inputs against the
                signature (TensorProtos for gRPC, JSON for REST), raising `ServingError` on bad input.
            timeout: seconds the request may wait for the model (batching only), None for no limit.
            cancelled: optional callable, True when the client went away.
        """
        with self.manager(name, version).acquire(version) as servable:
            runner = servable.runner(signature_name)
            request = runner.prepare(decode_inputs(runner), output_filter)
            if servable.scheduler is not None:
                outputs = servable.scheduler.submit(request, timeout, cancelled)
            else:
                outputs = runner.run_batch([request])[0]
                self.batch_stats.record_call(name, runner.name, 1, request.batch)
                if isinstance(outputs, ServingError):
                    raise outputs
            outputs = {alias: outputs[alias] for alias in request.output_filter}
            check_response_size(outputs, self.options.max_message_bytes)
            return servable.version, runner.name, outputs

    def model_status(self, name, version=None):
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(f"Could not find any versions of model {name}")
        return manager.status(version)

    def model_metadata(self, name, version=None):
        """A `GetModelMetadataResponse` with `metadata["signature_def"]` = the version's `SignatureDefMap`."""
        with self.manager(name, version).acquire(version) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature_def in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(signature_def)
            response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
            return response


# ---------------------------------------------------------------------------------------------------- gRPC


def _model_spec(request):
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    spec = request.model_spec
    if spec.version_label:
        raise not_found(f"Unrecognized servable version label: {spec.version_label} (this server has no labels)")
    return spec.name, (spec.version.value if spec.HasField("version") else None)


def _decode_tensor_protos(protos):
    def decode(runner):
        runner.check_input_names(protos.keys())
        arrays = {}
        for alias, proto in protos.items():
            runner.check_tensor_proto(alias, proto)
            try:
                arrays[alias] = tf.make_ndarray(proto)
            except Exception as e:
                raise invalid_argument(
                    f"input '{alias}': cannot read the TensorProto ({type(e).__name__}: {e})"
                ) from None
        return arrays

    return decode


def _answer(context, method, response_type, work):
    """Runs `work()`; a `ServingError` (or any exception) becomes the call's status, never a crash."""
    try:
        return work()
    except ServingError as e:
        code, details = e.code, e.details
        logger.debug("%s: %s %s", method, code.name, details)
    except MemoryError:
        code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, "out of memory: send fewer or shorter sentences"
        logger.error("%s: out of memory", method)
    except Exception as e:
        code, details = grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"
        logger.exception("%s failed", method)
    context.set_code(code)
    context.set_details(details)
    return response_type()


class _PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, server):
        self.server = server

    def Predict(self, request, context):
        def work():
            name, version = _model_spec(request)
            served, signature, outputs = self.server.predict(  # "no deadline" (~9.2e18 s): BatchScheduler.submit
                name,
                version,
                request.model_spec.signature_name,
                _decode_tensor_protos(request.inputs),
                tuple(request.output_filter),
                timeout=context.time_remaining(),
                cancelled=lambda: not context.is_active(),
            )
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = served
            response.model_spec.signature_name = signature
            for alias, value in outputs.items():
                response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
            return response

        return _answer(context, "Predict", predict_pb2.PredictResponse, work)

    def GetModelMetadata(self, request, context):
        def work():
            name, version = _model_spec(request)
            if not request.metadata_field:
                raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
            for field in request.metadata_field:
                if field != SIGNATURE_DEF_FIELD:
                    raise invalid_argument(f"Metadata field {field} is not supported")
            return self.server.model_metadata(name, version)

        return _answer(context, "GetModelMetadata", get_model_metadata_pb2.GetModelMetadataResponse, work)


class _ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, server):
        self.server = server

    def GetModelStatus(self, request, context):
        def work():
            name, version = _model_spec(request)
            return self.server.model_status(name, version)

        return _answer(context, "GetModelStatus", get_model_status_pb2.GetModelStatusResponse, work)
