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
import shutil
import signal
import sys
import threading

from elmo_tf.cli import ArgumentParser, UsageError, setup_logging
from elmo_tf.cli.serve_flags import (
    BATCHING_FLAGS,
    DEFAULTS,
    EMBEDDED_FLAGS,
    TF_SERVING_FLAGS,
    add_flags,
    flag_value,
    server_option_values,
)
from elmo_tf.serving.config_files import (
    MAX_BATCH_THREADS,
    parse_batching_parameters,
    parse_model_config,
    parse_monitoring_config,
    parse_ssl_config,
)
from elmo_tf.serving.options import ServerOptions

logger = logging.getLogger("serve")
PROG = "serve.py"
STOCK_BINARY = "tensorflow_model_server"

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
    add_flags(
        parser.add_argument_group("TF Serving flags (passed to tensorflow_model_server as --name=value)"),
        TF_SERVING_FLAGS,
    )
    add_flags(parser.add_argument_group("embedded server only (dropped for tensorflow_model_server)"), EMBEDDED_FLAGS)
    return parser


def stock_command(binary, given, extra):
    """argv for tensorflow_model_server: the TF Serving flags given, as --name=value, then `extra` verbatim."""
    return [binary] + [f"--{name}={flag_value(given[name])}" for name in TF_SERVING_FLAGS if name in given] + extra


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
    for name in BATCHING_FLAGS:  # flags win over the file
        if getattr(args, name) is not None:
            batching[name] = getattr(args, name)
    return batching, models, settings


def server_options(args, batching, settings=None):
    """`ServerOptions` of the flags (`batching`: the batching parameters; `settings`: the monitoring and TLS settings
    `_config_files` read, else read here); UsageError for values it refuses."""
    if settings is None:
        settings = {"prometheus_path": prometheus_path(args), "ssl": ssl_config(args)}
    from elmo_tf.serving.batching.scheduler import BatchingOptions  # loads TensorFlow

    # the flags and files' batching parameters, the rest `BatchingOptions`' defaults but the threads: one per CPU
    given = {"num_threads": batching.get("num_batch_threads", min(os.cpu_count() or 1, MAX_BATCH_THREADS))}
    if "max_batch_size" in batching:
        given["max_batch_size"] = batching["max_batch_size"]
    if "batch_timeout_micros" in batching:
        given["batch_timeout"] = batching["batch_timeout_micros"] / 1e6
    try:
        return ServerOptions(batching=BatchingOptions(**given), **server_option_values(args), **settings)
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
