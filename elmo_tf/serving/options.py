"""`ServerOptions`: the settings of the embedded model server, shared by its core, its fronts and its command line.

Each setting that `elmo-tf serve` takes as a flag is one field made by `option`: its default, its help and its range
live there once, and the command line (`elmo_tf.cli.serve_flags`) builds the flag, the default its help shows and the
value it passes on from that field, as TF Serving's model_servers/main.cc binds each flag to one field of its Options.
Imports neither TensorFlow nor gRPC, so the command line reads these fields before either loads.
"""

import dataclasses
import typing

from elmo_tf.bounds import Bounds
from elmo_tf.serving.grpc.tls import SslConfig
from elmo_tf.serving.limits.byte_units import MAX_PORT, MiB
from elmo_tf.serving.mixed_precision import check_mixed_precision

if typing.TYPE_CHECKING:
    from elmo_tf.serving.batching.scheduler import BatchingOptions

PORT = Bounds(int, 0, MAX_PORT)  # a TCP port: 0 (the flag: none; the library: a free one) to 65535


def option(default, help, bounds=None, *, off=None, **extra):
    """A field that is also a flag of `elmo-tf serve` (`--` and the field's name, TF Serving's spelling).

    Args:
        default: the setting's default, the one place it is written.
        help: the flag's help; "{default}" in it stands for the default as the flag writes it (true, 1, 8500).
        bounds: the `Bounds` the flag's value is parsed within (a number flag).
        off: the flag's value that stands for None (0: no TCP port, no limit; "": no socket).
        extra: more for the command line (`port=True`: ASCII digits only, as TF Serving reads an int32;
            `short="-v"`).
    """
    return dataclasses.field(default=default, metadata={"help": help, "bounds": bounds, "off": off, **extra})


def _batching_options():
    from elmo_tf.serving.batching.scheduler import (
        BatchingOptions,  # loads gRPC and TensorFlow: only once a server is built
    )

    return BatchingOptions()


@dataclasses.dataclass
class ServerOptions:
    """Settings of the embedded server (the CLI flags of `serving/serve.py`, TF Serving's names where it has one).

    Args:
        host: interface to bind, "127.0.0.1" (local only) by default; "0.0.0.0" for all.
        port: gRPC TCP port; None for none (gRPC on `grpc_socket_path` only, which must then be set). 0 picks a free
            one (`server.ModelServer.grpc_port`): an extension of this library API for tests and benchmarks; on the
            command line `--port 0` means no TCP port, as stock's (`elmo_tf.cli.serve`).
        grpc_socket_path: a UNIX socket path gRPC also listens on ("unix:PATH"), as stock's --grpc_socket_path; None
            for none.
        rest_api_port: REST port; None for no REST server, 0 picks a free one (a library extension too). Equal to a
            non-zero `port`, the REST API is skipped with an error logged, as stock skips it.
        enable_batching: merge concurrent requests (`elmo_tf.serving.batching.scheduler`).
        batching: `BatchingOptions` (max_batch_size, batch_timeout, num_threads).
        max_request_sentences: rows per request (the request budget, `elmo_tf.serving.limits.budget.Limits`).
        max_tokens_per_sentence: tokens per row (None: no limit).
        max_request_tokens: rows x width per request (None: no limit).
        max_message_bytes: gRPC max send/receive message size, the request's bytes in and its response's bytes out
            (`Limits.max_request_bytes`, `Limits.max_response_bytes`), and a bound of the REST body.
        max_requests_in_flight: Predict requests running or queued at once, over gRPC and REST together.
        rest_api_max_body_bytes: REST body limit (None: `elmo_tf.serving.rest.rest_front`'s default, 8 MiB).
        rest_api_max_bytes_in_flight: bytes of bodies and responses the REST front holds at once (None: 64 MiB,
            `elmo_tf.serving.rest.rest_front`'s default).
        file_system_poll_wait_seconds: how often base paths are polled for new versions.
        max_num_load_retries: retries of a version that failed to load (0: one attempt).
        load_retry_interval_micros: time between those retries.
        grpc_max_threads: threads that run gRPC calls (a call waiting for its request holds none); 4 x this many
            calls may be open at once.
        grpc_request_receive_timeout_s: seconds a gRPC call may take from its start until its request message has
            arrived; past that it ends (DEADLINE_EXCEEDED) and frees its place among the open calls.
        rest_api_num_threads: REST worker threads.
        rest_api_timeout_in_ms: REST request deadline.
        enable_model_warmup: warm a version up when it loads (`servable.Servable.warm_up`: its warmup file, then a
            small request to each signature the file leaves out), as stock's --enable_model_warmup (on by default);
            off, nothing runs at load and the first requests pay the graph's first runs.
        allow_version_labels_for_unavailable_models: take the models' version labels although no version is
            AVAILABLE yet, as stock's flag of that name (off by default: stock refuses every label at start-up, see
            `config_files.check_version_labels`).
        enable_grpc_healthcheck_service: serve the standard `grpc.health.v1.Health` service, as stock's flag of that
            name, with stock's service names ("", "ModelService", "PredictionService"): SERVING once every model has
            an AVAILABLE version, NOT_SERVING before that and, for good, once the server drains
            (`server.ModelServer.drain`).
        prometheus_path: the REST path of the Prometheus metrics (`elmo_tf.serving.metrics`), as a
            MonitoringConfig's `prometheus_config.path` (stock's default "/monitoring/prometheus/metrics"); None: not
            served (stock serves them only when --monitoring_config_file enables them).
        mixed_precision: stock's --mixed_precision (`elmo_tf.serving.mixed_precision`): "bfloat16" turns on TensorFlow's
            bfloat16 auto mixed precision rewrite of every model's graph (process-wide, before each version loads);
            another non-empty value is logged and ignored, as stock; "" (the default): none.
        ssl: an `SslConfig`: gRPC over TLS on every gRPC address (TCP and UNIX socket, as stock), mutual TLS with
            `client_verify`; None: plaintext. The REST port stays plaintext, as stock's.
    """

    host: str = option(
        "127.0.0.1", "interface to bind ({default}; 0.0.0.0 for all, which the stock server always uses: see above)"
    )
    port: int = option(8500, "gRPC TCP port ({default}; 0: none, needs --grpc_socket_path)", PORT, off=0, port=True)
    grpc_socket_path: str = option(None, "also serve gRPC on this UNIX socket (unix:PATH)", off="")
    rest_api_port: int = option(
        None, "REST port ({default}: no REST API; equal to --port: skipped)", PORT, off=0, port=True
    )
    enable_batching: bool = option(True, "merge concurrent requests (embedded: on by default; stock: off by default)")
    batching: "BatchingOptions" = dataclasses.field(default_factory=_batching_options)
    # the request budget (`Limits`, whose own defaults tests/serving/test_options.py holds equal to these)
    max_request_sentences: int = option(256, "rows per request ({default})", Bounds(int, 1))
    max_tokens_per_sentence: int = option(1000, "tokens per sentence ({default}; 0: no limit)", Bounds(int, 0), off=0)
    max_request_tokens: int = option(
        16384, "rows x tokens of a request ({default}; 0: no limit)", Bounds(int, 0), off=0
    )
    max_message_bytes: int = option(256 * MiB, "gRPC message size ({default})", Bounds(int, 1))
    max_requests_in_flight: int = option(64, "Predict requests at once, gRPC and REST ({default})", Bounds(int, 1))
    file_system_poll_wait_seconds: float = option(
        1.0, "seconds between polls of the base path for new versions ({default})", Bounds(float, 0, open_low=True)
    )
    max_num_load_retries: int = option(5, "retries of a failed load ({default})", Bounds(int, 0))
    load_retry_interval_micros: int = option(
        60 * 1000 * 1000, "time between those retries ({default}: 1 min)", Bounds(int, 0)
    )
    grpc_max_threads: int = option(
        64,
        "threads running gRPC calls ({default}; calls waiting for their request hold none; 4x: open calls at most)",
        Bounds(int, 1),
    )
    grpc_request_receive_timeout_s: float = 30.0
    rest_api_num_threads: int = option(32, "REST handler threads ({default})", Bounds(int, 1))
    rest_api_timeout_in_ms: int = option(30000, "REST request deadline ({default})", Bounds(int, 1))
    # None: rest_front's DEFAULT_MAX_BODY_BYTES and DEFAULT_MAX_BYTES_IN_FLIGHT (tests/cli/test_serve_flags.py holds
    # the help's numbers equal to them)
    rest_api_max_body_bytes: int = option(None, f"REST request body ({8 * MiB})", Bounds(int, 1))
    rest_api_max_bytes_in_flight: int = option(
        None, f"REST bodies and responses held at once ({64 * MiB})", Bounds(int, 1)
    )
    enable_model_warmup: bool = option(
        True,
        "replay the export's warmup file at load, and run signatures it leaves out once ({default}); false: nothing "
        "runs at load, the first requests pay the graph's first runs",
    )
    allow_version_labels_for_unavailable_models: bool = option(
        False,
        "take the version_labels of --model_config_file although no version is loaded yet ({default}: a config "
        "with labels is refused at start-up, as stock refuses it)",
    )
    enable_grpc_healthcheck_service: bool = option(
        False,
        "serve grpc.health.v1.Health ('', ModelService, PredictionService): SERVING once every model has a "
        "version, NOT_SERVING before and while draining ({default})",
    )
    mixed_precision: str = option(
        "",
        "bfloat16: rewrite every model's graph to compute its matmuls and convolutions in bfloat16 (TensorFlow's "
        "auto_mixed_precision_onednn_bfloat16 pass, which needs its oneDNN optimizations: AVX-512, or "
        "TF_ENABLE_ONEDNN_OPTS=1); another value is logged and ignored, as stock (default: empty, off)",
    )
    prometheus_path: str = None
    ssl: SslConfig = None

    def __post_init__(self):
        for name in ("port", "rest_api_port"):  # a TCP port: 0 (a free one) to 65535, or None (none)
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PORT
            ):
                raise ValueError(f"{name} must be an int in [0, {MAX_PORT}], got {value!r}")
        path = self.grpc_socket_path
        if path is not None and (not isinstance(path, str) or not path):
            raise ValueError(f"grpc_socket_path must be None or a non-empty path, got {path!r}")
        if self.port is None and self.grpc_socket_path is None:  # stock's Server::BuildAndStart (server.cc)
            raise ValueError(
                "port is None and grpc_socket_path is None: At least one of server_options.grpc_port or "
                "server_options.grpc_socket_path must be set."
            )
        if not isinstance(self.max_message_bytes, int) or not 1 <= self.max_message_bytes < 2**31:
            raise ValueError(
                f"max_message_bytes must be in [1, 2**31 - 1] (a gRPC limit), got {self.max_message_bytes!r}"
            )
        if not self.grpc_request_receive_timeout_s > 0:
            raise ValueError(f"grpc_request_receive_timeout_s must be > 0, got {self.grpc_request_receive_timeout_s!r}")
        if not self.file_system_poll_wait_seconds > 0:
            raise ValueError(f"file_system_poll_wait_seconds must be > 0, got {self.file_system_poll_wait_seconds!r}")
        for name, low in (
            ("max_requests_in_flight", 1),
            ("max_num_load_retries", 0),
            ("load_retry_interval_micros", 0),
            ("grpc_max_threads", 1),
            ("rest_api_num_threads", 1),
            ("rest_api_timeout_in_ms", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for name in ("rest_api_max_body_bytes", "rest_api_max_bytes_in_flight"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        check_mixed_precision(self.mixed_precision)
        path = self.prometheus_path
        if path is not None and (not isinstance(path, str) or not path.startswith("/") or path.startswith("/v1/")):
            raise ValueError(f"prometheus_path must be None or a path starting with / (not /v1/), got {path!r}")
        _ = self.limits  # validates the request limits

    @property
    def limits(self):
        """The request budget, a `budget.Limits`."""
        from elmo_tf.serving.limits.budget import Limits  # loads TensorFlow: only once a server is built

        return Limits(
            max_request_sentences=self.max_request_sentences,
            max_tokens_per_sentence=self.max_tokens_per_sentence,
            max_response_bytes=self.max_message_bytes,
            max_request_tokens=self.max_request_tokens,
            max_request_bytes=self.max_message_bytes,
        )
