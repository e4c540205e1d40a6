"""The embedded model server: a `core.ServerCore` (models, versions, requests) and its two fronts, TF Serving's gRPC
API (`grpc_front`) and its REST API (`rest_front`), so TF Serving's clients work unchanged. As TF Serving's Server
holds a ServerCore, `ModelServer` holds its core (`server.core`) and starts and stops it with the fronts.

Errors (gRPC status; REST maps them as TF Serving does, see `status`), with stock TF Serving's codes and texts:
    NOT_FOUND: unknown model name ("Servable not found for request: Latest(name)") or a version that is not
        AVAILABLE ("... Specific(name, 7)"), asked for by number or by a version label.
    FAILED_PRECONDITION: unknown signature on gRPC (`Serving signature key "x" not found.`); REST answers 400
        `Serving signature name: "x" not found in signature def`.
    INVALID_ARGUMENT: an empty model name ("ModelSpec has no name specified."), a version label the model's
        version_labels do not hold ("Unrecognized servable version label: x"), inputs or outputs that do not match
        the SignatureDef (see
        `budget`), a graph error caused by the values (TensorFlow's message), Classify, Regress or MultiInference of
        a signature that is not a classification or regression signature (see `inference`).
    UNIMPLEMENTED: Classify, Regress or MultiInference of one that is (the embedded server runs Predict only).
    RESOURCE_EXHAUSTED: a request above the request budget (see `budget.Limits`), above the gRPC message size
        (`max_message_bytes`, both directions; gRPC's own message), beyond `max_requests_in_flight` Predict requests
        at once, or beyond the calls gRPC holds open (4 x `grpc_max_threads`).
    DEADLINE_EXCEEDED: the client's deadline passed before the model ran, or while its request waited for it.
    INTERNAL: a bug; logged with its traceback. No request error stops the server.
Messages never show the server's filesystem paths (the log does).

Versions: each model serves the versions its version policy selects (`latest { num_versions: N }`, by default 1;
`all {}`; `specific { versions }`), loads new ones and unloads those no longer selected without dropping
availability (`manager`); a request without a version gets the highest AVAILABLE one. Version labels come from the
model config (`config_files.ModelConfig`) and are refused at start-up unless
`allow_version_labels_for_unavailable_models`, as stock refuses them.

Concurrency: gRPC calls wait for their requests on an asyncio loop (`grpc.aio`) and run on a pool of
`grpc_max_threads` threads, REST requests are read on the REST front's event loop;
with batching (on by default, see `batching`) `num_batch_threads` workers make the model calls, merging concurrent
requests. Binds 127.0.0.1 unless `host` says otherwise; gRPC also (or only: `port=None`) on a UNIX socket
(`grpc_socket_path`). Port 0 picks a free port (`ServerOptions`: a library extension for tests and benchmarks; the
command line's `--port 0` turns gRPC's TCP port off, as stock's).

Example:
    server = ModelServer({"elmo": "models/elmo"}, ServerOptions(port=0, rest_api_port=0)).start()
    print(server.grpc_port, server.rest_port, server.core.stats())
    ...
    server.stop()
"""

import logging
import threading
import time

from elmo_tf.serving.core import ServerCore
from elmo_tf.serving.grpc.grpc_front import GrpcServer, listen_address
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.rest.rest_front import RestServer

logger = logging.getLogger(__name__)


class ModelServer:
    """The `ServerCore` of `models`, served over gRPC (on `options.port` and/or `options.grpc_socket_path`), and over
    REST when `options.rest_api_port` is not None.

    Args:
        models: `{model_name: base_path or config_files.ModelConfig}` (a base path: latest 1, no labels).
        options: `ServerOptions`.
    Raises:
        ValueError: version labels stock refuses at start-up (`config_files.check_version_labels`).
    Attributes:
        core: the `ServerCore` (models, versions, predict, status, metadata, stats).
        grpc_port, rest_port: the TCP ports listened on once started (None before; None for gRPC on a UNIX socket
            only, and for REST when it is off, skipped or could not start).
    """

    def __init__(self, models, options=None):
        self.options = options or ServerOptions()
        self.core = ServerCore(models, self.options)
        self._grpc = None
        self._rest = None
        self.grpc_port = None
        self.rest_port = None
        self._health_stop = threading.Event()
        self._health_thread = None

    def start(self):
        """Loads the versions each model's policy selects, then listens: gRPC (its TCP port and/or its UNIX socket;
        OSError if it cannot), then REST when `rest_api_port` is set. As stock's Server::BuildAndStart (server.cc), REST
        is skipped with an error logged when its port is gRPC's, and a REST server that cannot start is logged ("Failed
        to start HTTP Server at ...") while gRPC keeps serving (`rest_port` stays None)."""
        self.core.poll()
        self._grpc = GrpcServer(self.core, self.options)
        self._grpc.start()
        self.grpc_port = self._grpc.port
        self._start_rest()
        self.core.start_polling()
        if self._grpc.health is not None:
            served = self._set_health()
            self._health_thread = threading.Thread(
                target=self._watch_health, args=(served,), name="grpc-health", daemon=True
            )
            self._health_thread.start()
        return self

    HEALTH_SERVICES = ("", "ModelService", "PredictionService")  # stock's (server.cc BuildAndStart), and gRPC's ""
    HEALTH_POLL_SECONDS = 0.25

    def ready(self):
        """True when every model has an AVAILABLE version (what the health service answers SERVING for)."""
        return all(manager.served_version is not None for manager in self.core.managers.values())

    def _set_health(self):
        ready = self.ready()
        self._grpc.set_health({service: ready for service in self.HEALTH_SERVICES})
        return ready

    def _watch_health(self, served):
        """Sets the health service when readiness changes from `served` (what `start` set), not on every tick: each
        setting is a round trip to the gRPC loop."""
        while not self._health_stop.wait(self.HEALTH_POLL_SECONDS):
            if self.ready() == served:
                continue
            try:
                served = self._set_health()
            except Exception:  # the loop is stopping: the next tick or the drain settles it
                logger.debug("health update failed", exc_info=True)

    def drain(self, grace, interrupted=None):
        """Stops taking requests while those in flight finish: the health service turns NOT_SERVING for good, new
        gRPC calls are refused UNAVAILABLE and REST requests 503, and this waits until no Predict request is in
        flight, at most `grace` seconds, or until `interrupted()` (a second SIGTERM) is true. Returns True when
        every request in flight finished. Call `stop` afterwards."""
        self.core.drain()
        self._health_stop.set()
        if self._grpc is not None:
            self._grpc.drain_health()
        end = time.monotonic() + grace
        while True:
            left = end - time.monotonic()
            if self.core.wait_idle(max(0.0, min(left, 0.1))):
                return True
            if left <= 0 or (interrupted is not None and interrupted()):
                return False

    def _start_rest(self):
        options = self.options
        if options.rest_api_port is None:
            return
        if options.rest_api_port != 0 and options.rest_api_port == options.port:
            logger.error(
                "server_options.http_port cannot be same as grpc_port. Please use a different port for HTTP/REST "
                "API. Skipped exporting HTTP/REST API."
            )
            return
        address = listen_address(options.host, options.rest_api_port)
        try:
            self._rest = RestServer(self.core, self.options)
            self._rest.start()
        except OSError as e:
            logger.error("Failed to start HTTP Server at %s (%s)", address, e)
            if self._rest is not None:
                self._rest.stop(0)
                self._rest = None
            return
        self.rest_port = self._rest.port
        rest = self._rest
        self.core.metrics.gauges["elmo_serving_rest_bytes_in_flight"] = (
            "REST request bodies and responses held (--rest_api_max_bytes_in_flight)",
            lambda: rest.in_flight,
        )
        logger.info("REST API listening on %s", listen_address(options.host, self.rest_port))

    def stop(self, grace=5.0):
        """Stops accepting requests, lets running ones finish (up to `grace` seconds), stops the model threads."""
        self._health_stop.set()
        stopped = self._grpc.stop(grace) if self._grpc is not None else None  # drains in the background
        if self._rest is not None:
            self._rest.stop(grace)
        if stopped is not None:
            stopped.wait(grace + 1.0)
        self.core.stop(grace)
        logger.info("server stopped")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
