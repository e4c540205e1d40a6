"""`serve`: serves SavedModel exports over TF Serving's gRPC and REST APIs: the stock model server when installed, else
the embedded one (`elmo_tf.serving.server`). `serving/serve.py` runs `main` under the `elmo_tf.cli` contract.

    python serving/serve.py --model_base_path models/elmo --model_name elmo --port 8500 [--rest_api_port 8501]

With `tensorflow_model_server` on PATH (and no --embedded), this script replaces itself with it (exec), passing
the TF Serving flags it was given as `--flag=value` plus any flags it does not know verbatim (e.g.
--monitoring_config_file); the embedded server's own flags (--max_*, --num_batch_threads, ...) are dropped with a
warning. The stock server has no flag for the address it binds: it listens on all interfaces (gRPC on
0.0.0.0:--port, REST on [::]:--rest_api_port; `--grpc_socket_path` adds a UNIX socket). So the hand-over needs
`--host 0.0.0.0` (or `::`), saying so; with the default --host 127.0.0.1, or any other address, serve.py refuses
(exit status 2) rather than listen on all interfaces: give --embedded to serve on that address. Its batching is
off unless --enable_batching is given.

Otherwise the embedded server runs (see elmo_tf/serving/server.py for the API, versions and errors): it binds
127.0.0.1 unless --host says otherwise, batches concurrent requests unless --enable_batching=false, polls
--model_base_path for new versions every --file_system_poll_wait_seconds, and stops gracefully on SIGTERM or
SIGINT (no new requests, running ones finish, exit status 0). A bad flag or config file: one line naming the
flag, exit status 2; a gRPC port or socket that cannot be bound: exit status 1. --model_config_file's version
policies and version labels are served as stock serves them; as stock, labels are refused at start-up (no version
is loaded yet) unless --allow_version_labels_for_unavailable_models is given.

Ports as stock's (tensorflow_serving/model_servers/server.cc, Server::BuildAndStart): `--port 0` turns gRPC's TCP port
off, so it needs `--grpc_socket_path` (gRPC on that UNIX socket only), else it is a usage error with stock's text
(~183-188); `--rest_api_port` equal to `--port` skips the REST API with stock's error logged, and a REST port that
cannot be bound is logged ("Failed to start HTTP Server at ...") while gRPC serves on (~437-460). (The library's
`ServerOptions(port=0)` picks a free port instead: an extension for tests, not a flag value.)
"""

import argparse
import logging
import os
import re
import shutil
import signal
import sys
import threading

from elmo_tf.cli import ArgumentParser, UsageError, bounded_number, number_type, setup_logging
from elmo_tf.serving.config_files import (
    BATCHING_BOUNDS,
    MAX_BATCH_THREADS,
    parse_batching_parameters,
    parse_model_config,
    parse_monitoring_config,
    parse_ssl_config,
)
from elmo_tf.serving.sizes import MAX_PORT, MiB

logger = logging.getLogger("serve")
BATCHING_HELP = {  # in the order of --help
    "max_batch_size": "rows of a merged model call (32)",
    "batch_timeout_micros": "wait for more requests once one is held (0: merge only what queued)",
    "num_batch_threads": "model calls at once (CPU count)",
}

PROG = "serve.py"
STOCK_BINARY = "tensorflow_model_server"

# flags TF Serving's model server has (passed to it as --name=value)
TF_SERVING_FLAGS = (
    "port",
    "grpc_socket_path",
    "rest_api_port",
    "rest_api_num_threads",
    "rest_api_timeout_in_ms",
    "model_name",
    "model_base_path",
    "model_config_file",
    "enable_batching",
    "batching_parameters_file",
    "file_system_poll_wait_seconds",
    "max_num_load_retries",
    "load_retry_interval_micros",
    "tensorflow_intra_op_parallelism",
    "tensorflow_inter_op_parallelism",
    "grpc_max_threads",
    "enable_model_warmup",
    "allow_version_labels_for_unavailable_models",
    "enable_grpc_healthcheck_service",
    "monitoring_config_file",
    "ssl_config_file",
    "model_config_file_poll_wait_seconds",
)
# the embedded server's own flags (dropped when running the stock server)
EMBEDDED_FLAGS = (
    "host",
    "max_batch_size",
    "batch_timeout_micros",
    "num_batch_threads",
    "max_request_sentences",
    "max_tokens_per_sentence",
    "max_request_tokens",
    "max_message_bytes",
    "max_requests_in_flight",
    "rest_api_max_body_bytes",
    "rest_api_max_bytes_in_flight",
    "drain_grace_seconds",
    "embedded",
    "verbose",
)
EXAMPLES = """examples:
  python serving/serve.py --model_base_path models/elmo --model_name elmo --port 8500 --rest_api_port 8501
  python serving/serve.py --model_config_file models.config --batching_parameters_file batching.config
  python serving/serve.py --embedded --model_base_path models/elmo --model_name elmo --host 0.0.0.0 \\
      --max_tokens_per_sentence 400 --enable_batching=false

request limits of the embedded server (RESOURCE_EXHAUSTED above them, before the model runs):
  --max_request_sentences rows per request; --max_tokens_per_sentence the width of a `tokens` input and the
  whitespace-separated tokens of each sentence of a `sentences` input (0: no limit); --max_request_tokens rows x
  tokens of one request (0: no limit); --max_message_bytes the gRPC message size both ways, the request's bytes
  in, the estimated response, and a bound of the REST body; --rest_api_max_body_bytes the REST body;
  --rest_api_max_bytes_in_flight REST bodies and responses held at once; --max_requests_in_flight Predict requests
  running or queued at once, gRPC and REST together (past it: RESOURCE_EXHAUSTED at once).
"""
ALL_INTERFACES = ("0.0.0.0", "::", "[::]")


def _bool(text):
    """TF Serving's boolean flag values: true/false, 1/0, yes/no."""
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _int(flag, minimum):
    return bounded_number(flag, int, minimum=minimum)


def _port(flag):
    """A TCP port: ASCII digits (as TF Serving's flag parser reads an int32; Python's int() would also take
    Arabic-Indic digits or "8_500"), 0 to 65535 (stock would pass 70000 on to the socket: 70000 % 65536)."""
    bounded = bounded_number(flag, int, minimum=0, maximum=MAX_PORT)

    def parse(text):
        if not re.fullmatch(r"\s*[-+]?[0-9]+\s*", text):
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}")
        return bounded(text)

    parse.bounds = bounded.bounds
    return parse


def build_parser(prog=PROG):
    """All defaults are SUPPRESS, so the namespace holds only the flags given (see `DEFAULTS`)."""
    parser = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_tf_serving_flags(
        parser.add_argument_group("TF Serving flags (passed to tensorflow_model_server as --name=value)")
    )
    _add_embedded_flags(parser.add_argument_group("embedded server only (dropped for tensorflow_model_server)"))
    return parser


def _add_tf_serving_flags(group):
    group.add_argument("--port", type=_port("--port"), help="gRPC TCP port (8500; 0: none, needs --grpc_socket_path)")
    group.add_argument("--grpc_socket_path", help="also serve gRPC on this UNIX socket (unix:PATH)")
    group.add_argument(
        "--rest_api_port", type=_port("--rest_api_port"), help="REST port (0: no REST API; equal to --port: skipped)"
    )
    group.add_argument(
        "--rest_api_num_threads", type=_int("--rest_api_num_threads", 1), help="REST handler threads (32)"
    )
    group.add_argument(
        "--rest_api_timeout_in_ms", type=_int("--rest_api_timeout_in_ms", 1), help="REST request deadline (30000)"
    )
    group.add_argument("--model_name", help='name clients ask for ("default", as TF Serving)')
    group.add_argument("--model_base_path", help="directory of integer version subdirectories")
    group.add_argument(
        "--model_config_file",
        help="ModelServerConfig text proto (model_config_list); instead of --model_name/--model_base_path",
    )
    group.add_argument(
        "--enable_batching",
        type=_bool,
        nargs="?",
        const=True,
        help="merge concurrent requests (embedded: on by default; stock: off by default)",
    )
    group.add_argument(
        "--batching_parameters_file",
        help="BatchingParameters text proto (max_batch_size, batch_timeout_micros, num_batch_threads)",
    )
    group.add_argument(
        "--model_config_file_poll_wait_seconds",
        type=_int("--model_config_file_poll_wait_seconds", 0),
        help="re-read --model_config_file every this many seconds and serve what it lists (add, remove, re-version "
        "models; a file that does not parse is logged and the last good config kept); 0: read once (0)",
    )
    group.add_argument(
        "--ssl_config_file",
        help="SSLConfig text proto (server_key, server_cert, custom_ca: PEM contents; client_verify): gRPC over TLS, "
        "mutual TLS with client_verify: true",
    )
    group.add_argument(
        "--monitoring_config_file",
        help='MonitoringConfig text proto: prometheus_config { enable: true path: "/monitoring/prometheus/metrics" } '
        "serves the Prometheus metrics on the REST port (off without it)",
    )
    group.add_argument(
        "--file_system_poll_wait_seconds",
        type=bounded_number("--file_system_poll_wait_seconds", float, minimum=0, minimum_inclusive=False),
        help="seconds between polls of the base path for new versions (1)",
    )
    group.add_argument(
        "--max_num_load_retries", type=_int("--max_num_load_retries", 0), help="retries of a failed load (5)"
    )
    group.add_argument(
        "--load_retry_interval_micros",
        type=_int("--load_retry_interval_micros", 0),
        help="time between those retries (60000000: 1 min)",
    )
    for flag in ("--tensorflow_intra_op_parallelism", "--tensorflow_inter_op_parallelism"):
        group.add_argument(flag, type=_int(flag, 0), help="TF threads (0: auto)")
    group.add_argument(
        "--grpc_max_threads",
        type=_int("--grpc_max_threads", 1),
        help="threads running gRPC calls (64; calls waiting for their request hold none; 4x: open calls at most)",
    )
    group.add_argument(
        "--enable_model_warmup",
        type=_bool,
        nargs="?",
        const=True,
        help="replay the export's warmup file at load, and run signatures it leaves out once (true); false: nothing "
        "runs at load, the first requests pay the graph's first runs",
    )
    group.add_argument(
        "--allow_version_labels_for_unavailable_models",
        type=_bool,
        nargs="?",
        const=True,
        help="take the version_labels of --model_config_file although no version is loaded yet (false: a config "
        "with labels is refused at start-up, as stock refuses it)",
    )
    group.add_argument(
        "--enable_grpc_healthcheck_service",
        type=_bool,
        nargs="?",
        const=True,
        help="serve grpc.health.v1.Health ('', ModelService, PredictionService): SERVING once every model has a "
        "version, NOT_SERVING before and while draining (false)",
    )


def _add_embedded_flags(group):
    group.add_argument(
        "--embedded", action="store_true", help="run the embedded server even if tensorflow_model_server is on PATH"
    )
    group.add_argument(
        "--host",
        help="interface to bind (127.0.0.1; 0.0.0.0 for all, which the stock server always uses: see above)",
    )
    for name, text in BATCHING_HELP.items():  # the batching parameters' fields, bounded as in the file
        group.add_argument(f"--{name}", type=number_type(f"--{name}", BATCHING_BOUNDS[name]), help=text)
    group.add_argument(
        "--max_request_sentences", type=_int("--max_request_sentences", 1), help="rows per request (256)"
    )
    group.add_argument(
        "--max_tokens_per_sentence",
        type=_int("--max_tokens_per_sentence", 0),
        help="tokens per sentence (1000; 0: no limit)",
    )
    group.add_argument(
        "--max_request_tokens",
        type=_int("--max_request_tokens", 0),
        help="rows x tokens of a request (16384; 0: no limit)",
    )
    group.add_argument(
        "--max_message_bytes", type=_int("--max_message_bytes", 1), help=f"gRPC message size ({256 * MiB})"
    )
    group.add_argument(
        "--rest_api_max_body_bytes", type=_int("--rest_api_max_body_bytes", 1), help=f"REST request body ({8 * MiB})"
    )
    group.add_argument(
        "--rest_api_max_bytes_in_flight",
        type=_int("--rest_api_max_bytes_in_flight", 1),
        help=f"REST bodies and responses held at once ({64 * MiB})",
    )
    group.add_argument(
        "--max_requests_in_flight",
        type=_int("--max_requests_in_flight", 1),
        help="Predict requests at once, gRPC and REST (64)",
    )
    group.add_argument(
        "--drain_grace_seconds",
        type=bounded_number("--drain_grace_seconds", float, minimum=0),
        help="on SIGTERM, seconds the requests in flight may take to finish while new ones are refused (30); a "
        "second SIGTERM ends it at once",
    )
    group.add_argument("-v", "--verbose", action="store_true", help="debug logging")


DEFAULTS = dict(
    port=8500,
    grpc_socket_path=None,
    rest_api_port=0,
    rest_api_num_threads=32,
    rest_api_timeout_in_ms=30000,
    model_name="default",
    model_base_path=None,
    model_config_file=None,
    enable_batching=True,
    batching_parameters_file=None,
    monitoring_config_file=None,
    ssl_config_file=None,
    model_config_file_poll_wait_seconds=0,
    file_system_poll_wait_seconds=1.0,
    max_num_load_retries=5,
    load_retry_interval_micros=60 * 1000 * 1000,
    tensorflow_intra_op_parallelism=0,
    tensorflow_inter_op_parallelism=0,
    grpc_max_threads=64,
    enable_model_warmup=True,
    allow_version_labels_for_unavailable_models=False,
    enable_grpc_healthcheck_service=False,
    drain_grace_seconds=30.0,
    embedded=False,
    host="127.0.0.1",
    max_batch_size=None,
    batch_timeout_micros=None,
    num_batch_threads=None,
    max_request_sentences=256,
    max_tokens_per_sentence=1000,
    max_request_tokens=16384,
    max_message_bytes=256 * MiB,
    rest_api_max_body_bytes=None,
    rest_api_max_bytes_in_flight=None,
    max_requests_in_flight=64,
    verbose=False,
)


def _flag_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def stock_command(binary, given, extra):
    """argv for tensorflow_model_server: the TF Serving flags given, as --name=value, then `extra` verbatim."""
    return [binary] + [f"--{name}={_flag_value(given[name])}" for name in TF_SERVING_FLAGS if name in given] + extra


def hand_over(parser, binary, given, extra):
    """Replaces this process with the stock server `binary` (exec); refuses an address it cannot bind (exit 2).
    Returns 1 if it cannot be run."""
    host = given.get("host", DEFAULTS["host"])
    if host not in ALL_INTERFACES:
        parser.error(
            f"argument --host: {STOCK_BINARY} cannot bind {host}{'' if 'host' in given else ' (the default)'}: "
            f"it has no such flag and listens on all interfaces; pass --host 0.0.0.0 to run it that way, or "
            f"--embedded to serve on {host}"
        )
    logger.warning("%s listens on all interfaces (--host %s)", STOCK_BINARY, host)
    dropped = [f"--{name}" for name in EMBEDDED_FLAGS if name in given and name != "host"]
    if dropped:
        logger.warning("%s does not know %s: dropped", STOCK_BINARY, " ".join(dropped))
    command = stock_command(binary, given, extra)
    logger.info("running the stock model server: %s", " ".join(command))
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        os.execv(binary, command)
    except OSError as e:
        logger.error("cannot run %s: %s", binary, e)
        return 1


def ssl_config(args):
    """The `SslConfig` of --ssl_config_file, or None; UsageError naming the flag."""
    try:
        return parse_ssl_config(args.ssl_config_file) if args.ssl_config_file else None
    except ValueError as e:
        raise UsageError(f"--ssl_config_file: {e}") from None


def prometheus_path(args):
    """The REST path of the metrics that --monitoring_config_file enables, or None; UsageError naming the flag."""
    try:
        return parse_monitoring_config(args.monitoring_config_file) if args.monitoring_config_file else None
    except ValueError as e:
        raise UsageError(f"--monitoring_config_file: {e}") from None


def _config_files(args):
    """(batching parameters, {model name: base path or `ModelConfig`}, the monitoring and TLS settings as
    `server_options` takes them) from the config files and flags, each file read once; UsageError naming the flag."""
    try:
        batching = parse_batching_parameters(args.batching_parameters_file) if args.batching_parameters_file else {}
    except ValueError as e:
        raise UsageError(f"--batching_parameters_file: {e}") from None
    # a file stock refuses is a usage error before TensorFlow loads
    settings = {"prometheus_path": prometheus_path(args), "ssl": ssl_config(args)}
    try:
        models = (
            parse_model_config(args.model_config_file, args.allow_version_labels_for_unavailable_models)
            if args.model_config_file
            else {args.model_name: args.model_base_path}
        )
    except ValueError as e:
        raise UsageError(f"--model_config_file: {e}") from None
    for name in BATCHING_BOUNDS:  # flags win over the file
        if getattr(args, name) is not None:
            batching[name] = getattr(args, name)
    return batching, models, settings


def server_options(args, batching, settings=None):
    """`ServerOptions` of the flags (`batching`: the batching parameters; `settings`: the monitoring and TLS settings
    `_config_files` read, else read here); UsageError for values it refuses."""
    if settings is None:
        settings = {"prometheus_path": prometheus_path(args), "ssl": ssl_config(args)}
    from elmo_tf.serving.batching import BatchingOptions
    from elmo_tf.serving.options import ServerOptions

    try:
        return ServerOptions(
            host=args.host,
            port=args.port or None,
            grpc_socket_path=args.grpc_socket_path or None,
            rest_api_port=args.rest_api_port or None,
            enable_batching=args.enable_batching,
            batching=BatchingOptions(
                max_batch_size=batching.get("max_batch_size", 32),
                batch_timeout=batching.get("batch_timeout_micros", 0) / 1e6,
                num_threads=batching.get("num_batch_threads", min(os.cpu_count() or 1, MAX_BATCH_THREADS)),
            ),
            max_request_sentences=args.max_request_sentences,
            max_tokens_per_sentence=args.max_tokens_per_sentence or None,
            max_request_tokens=args.max_request_tokens or None,
            max_message_bytes=args.max_message_bytes,
            file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
            max_num_load_retries=args.max_num_load_retries,
            load_retry_interval_micros=args.load_retry_interval_micros,
            max_requests_in_flight=args.max_requests_in_flight,
            grpc_max_threads=args.grpc_max_threads,
            rest_api_num_threads=args.rest_api_num_threads,
            rest_api_timeout_in_ms=args.rest_api_timeout_in_ms,
            rest_api_max_body_bytes=args.rest_api_max_body_bytes,
            rest_api_max_bytes_in_flight=args.rest_api_max_bytes_in_flight,
            enable_model_warmup=args.enable_model_warmup,
            allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
            enable_grpc_healthcheck_service=args.enable_grpc_healthcheck_service,
            **settings,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def watch_model_config(server, path, seconds, stop):
    """Looks at `path` every `seconds` on a daemon thread until `stop` is set, and reloads the server's models when
    the file changed (its inode, size or modification time: an edit, or another file renamed over it;
    `ServerCore.reload`); a file that cannot be read or parsed, or a config the core refuses, is logged and the models
    served stay as they were (stock's --model_config_file_poll_wait_seconds)."""

    def stamp():
        try:
            info = os.stat(path)
        except OSError:
            return None  # gone or unreadable: parse_model_config names why
        return info.st_ino, info.st_size, info.st_mtime_ns

    def loop():
        last = stamp()
        while not stop.wait(seconds):
            current = stamp()
            if current == last:
                continue
            last = current
            try:
                server.core.reload(parse_model_config(path, None))
            except ValueError as e:
                logger.error("--model_config_file: %s; still serving %s", e, sorted(server.core.managers))

    threading.Thread(target=loop, name="model-config-poll", daemon=True).start()


def run_embedded(args):
    """Runs the embedded server of the flags until SIGTERM/SIGINT; returns the exit status."""
    # a config file stock refuses is a usage error before TensorFlow loads
    batching, models, settings = _config_files(args)
    import tensorflow as tf

    if args.tensorflow_intra_op_parallelism:
        tf.config.threading.set_intra_op_parallelism_threads(args.tensorflow_intra_op_parallelism)
    if args.tensorflow_inter_op_parallelism:
        tf.config.threading.set_inter_op_parallelism_threads(args.tensorflow_inter_op_parallelism)
    from elmo_tf.serving.server import ModelServer

    options = server_options(args, batching, settings)
    stop = threading.Event()

    def on_signal(signum, _frame):
        logger.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = ModelServer(models, options)
    try:
        server.start()
    except OSError as e:
        logger.error("%s", e)
        server.stop(0)
        return 1
    grpc_addresses = [f"{options.host}:{server.grpc_port}"] if server.grpc_port else []
    grpc_addresses += [f"unix:{options.grpc_socket_path}"] if options.grpc_socket_path else []
    logger.info(
        "embedded model server ready: models %s, gRPC %s%s, batching %s",
        sorted(models),
        " and ".join(grpc_addresses),
        f", REST {options.host}:{server.rest_port}" if server.rest_port else "",
        "on" if options.enable_batching else "off",
    )
    if args.model_config_file and args.model_config_file_poll_wait_seconds:
        watch_model_config(server, args.model_config_file, args.model_config_file_poll_wait_seconds, stop)
    while not stop.wait(0.5):
        pass
    stop.clear()  # a second SIGTERM/SIGINT during the drain ends it at once
    logger.info("draining: new requests are refused; waiting up to %g s for those in flight", args.drain_grace_seconds)
    finished = server.drain(args.drain_grace_seconds, interrupted=stop.is_set)
    if not finished:
        logger.warning(
            "%d requests still in flight are dropped (%s)",
            server.core.stats()["in_flight"],
            "second signal" if stop.is_set() else f"--drain_grace_seconds {args.drain_grace_seconds:g} passed",
        )
    server.stop(grace=2.0 if finished else 0.0)
    return 0


def main(argv=None, prog=PROG):
    """The serve command line (see the module docstring); returns the exit status. Run it with `elmo_tf.cli.run`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    given_ns, extra = parser.parse_known_args(argv)
    given = vars(given_ns)
    setup_logging(verbose=given.get("verbose", False), fmt="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if given.get("port", DEFAULTS["port"]) == 0 and not given.get("grpc_socket_path"):  # stock's server.cc ~183-188
        parser.error(
            "argument --port: 0 turns gRPC's TCP port off and no --grpc_socket_path is given: At least one of "
            "server_options.grpc_port or server_options.grpc_socket_path must be set."
        )
    binary = shutil.which(STOCK_BINARY)
    if binary and not given.get("embedded"):
        return hand_over(parser, binary, given, extra)
    if extra:
        parser.error(
            f"unrecognized arguments: {' '.join(extra)} (flags the embedded server does not know are "
            f"passed through only to {STOCK_BINARY})"
        )
    args = argparse.Namespace(**{**DEFAULTS, **given})
    if args.model_config_file and "model_base_path" in given:
        parser.error("argument --model_config_file: not allowed with --model_base_path")
    if not args.model_config_file:
        if not args.model_base_path:
            parser.error("argument --model_base_path: required (or --model_config_file)")
        if not os.path.isdir(args.model_base_path):
            parser.error(f"argument --model_base_path: not a directory: {args.model_base_path!r}")
    return run_embedded(args)
