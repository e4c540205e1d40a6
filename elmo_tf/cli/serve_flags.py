"""The flags of `elmo-tf serve`, each bound to one field that holds its default, its help and its range
(`elmo_tf.serving.options.option`), as TF Serving's model_servers/main.cc binds each flag to one field of its Options:
`ServerOptions`'s fields for the server's settings, `CommandOptions`' (here) for what the command itself reads. The
parser's arguments (`add_flags`), `DEFAULTS`, the default each help shows and the `ServerOptions` values of the flags
(`server_option_values`) are derived from those fields; nothing here repeats a default.

Loads neither TensorFlow nor gRPC: a hand-over to the stock server parses its flags with these alone.
"""

import argparse
import dataclasses
import re

from elmo_tf.bounds import Bounds
from elmo_tf.cli import number_type
from elmo_tf.serving.config_files import BATCHING_BOUNDS
from elmo_tf.serving.options import ServerOptions, option

# flags TF Serving's model server has (passed to it as --name=value, in this order), as --help lists them
TF_SERVING_FLAGS = (
    *("port", "grpc_socket_path", "rest_api_port", "rest_api_num_threads", "rest_api_timeout_in_ms"),
    *("model_name", "model_base_path", "model_config_file", "enable_batching", "batching_parameters_file"),
    *("file_system_poll_wait_seconds", "max_num_load_retries", "load_retry_interval_micros"),
    *("tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism", "grpc_max_threads"),
    *("enable_model_warmup", "allow_version_labels_for_unavailable_models", "mixed_precision"),
    "enable_grpc_healthcheck_service",
    *("monitoring_config_file", "ssl_config_file", "model_config_file_poll_wait_seconds"),
)
# the embedded server's own flags (dropped when running the stock server), as --help lists them
EMBEDDED_FLAGS = (
    *("embedded", "host", "max_batch_size", "batch_timeout_micros", "num_batch_threads", "max_request_sentences"),
    *("max_tokens_per_sentence", "max_request_tokens", "max_message_bytes", "rest_api_max_body_bytes"),
    *("rest_api_max_bytes_in_flight", "max_requests_in_flight", "drain_grace_seconds", "verbose"),
)
BATCHING_FLAGS = tuple(BATCHING_BOUNDS)  # the batching parameters file's fields, flags of the same names


@dataclasses.dataclass(frozen=True)
class CommandOptions:
    """The flags of `elmo-tf serve` that are no `ServerOptions` field: the models and config files it reads, the
    TensorFlow threads it sets, the batching parameters (over the file's; None: the file's, else the defaults of
    `BatchingOptions`, the threads one per CPU), the drain at SIGTERM and the command's own switches."""

    model_name: str = option("default", 'name clients ask for ("{default}", as TF Serving)')
    model_base_path: str = option(None, "directory of integer version subdirectories")
    model_config_file: str = option(
        None, "ModelServerConfig text proto (model_config_list); instead of --model_name/--model_base_path"
    )
    batching_parameters_file: str = option(
        None, "BatchingParameters text proto (max_batch_size, batch_timeout_micros, num_batch_threads)"
    )
    model_config_file_poll_wait_seconds: int = option(
        0,
        "re-read --model_config_file every this many seconds and serve what it lists (add, remove, re-version "
        "models; a file that does not parse is logged and the last good config kept); 0: read once ({default})",
        Bounds(int, 0),
    )
    ssl_config_file: str = option(
        None,
        "SSLConfig text proto (server_key, server_cert, custom_ca: PEM contents; client_verify): gRPC over TLS, "
        "mutual TLS with client_verify: true",
    )
    monitoring_config_file: str = option(
        None,
        'MonitoringConfig text proto: prometheus_config { enable: true path: "/monitoring/prometheus/metrics" } '
        "serves the Prometheus metrics on the REST port (off without it)",
    )
    tensorflow_intra_op_parallelism: int = option(0, "TF threads ({default}: auto)", Bounds(int, 0))
    tensorflow_inter_op_parallelism: int = option(0, "TF threads ({default}: auto)", Bounds(int, 0))
    embedded: bool = option(False, "run the embedded server even if tensorflow_model_server is on PATH")
    # the help's 32 and 0 are `BatchingOptions`' defaults (tests/cli/test_serve_flags.py holds them equal)
    max_batch_size: int = option(None, "rows of a merged model call (32)", BATCHING_BOUNDS["max_batch_size"])
    batch_timeout_micros: int = option(
        None,
        "wait for more requests once one is held (0: merge only what queued)",
        BATCHING_BOUNDS["batch_timeout_micros"],
    )
    num_batch_threads: int = option(None, "model calls at once (CPU count)", BATCHING_BOUNDS["num_batch_threads"])
    drain_grace_seconds: float = option(
        30.0,
        "on SIGTERM, seconds the requests in flight may take to finish while new ones are refused ({default}); a "
        "second SIGTERM ends it at once",
        Bounds(float, 0),
    )
    verbose: bool = option(False, "debug logging", short="-v")


FIELDS = {
    field.name: field
    for options in (ServerOptions, CommandOptions)
    for field in dataclasses.fields(options)
    if "help" in field.metadata
}


def flag_value(value):
    """A value as a flag writes it: true/false, 1 for 1.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def flag_default(field):
    """The default of a field's flag: the field's, a None number written as its `off` value (a port of 0: none)."""
    off = field.metadata["off"]
    return off if field.default is None and isinstance(off, int) else field.default


DEFAULTS = {name: flag_default(FIELDS[name]) for name in TF_SERVING_FLAGS + EMBEDDED_FLAGS}


def parse_bool(text):
    """TF Serving's boolean flag values: true/false, 1/0, yes/no."""
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def port_type(flag, bounds):
    """A TCP port: ASCII digits (as TF Serving's flag parser reads an int32; Python's int() would also take
    Arabic-Indic digits or "8_500"), 0 to 65535 (stock would pass 70000 on to the socket: 70000 % 65536)."""
    bounded = number_type(flag, bounds)

    def parse(text):
        if not re.fullmatch(r"\s*[-+]?[0-9]+\s*", text):
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}")
        return bounded(text)

    parse.bounds = bounded.bounds
    return parse


def _argument(name, field):
    """`add_argument`'s keywords for the field's flag: a TF Serving boolean takes a value (--name=false), as its
    flags do; the embedded server's switches are store_true."""
    flag, meta = f"--{name}", field.metadata
    kwargs = {"help": meta["help"].replace("{default}", flag_value(flag_default(field)))}
    if field.type is bool:
        booleans = {"type": parse_bool, "nargs": "?", "const": True}
        kwargs.update(booleans if name in TF_SERVING_FLAGS else {"action": "store_true"})
    elif meta.get("port"):
        kwargs["type"] = port_type(flag, meta["bounds"])
    elif meta["bounds"] is not None:
        kwargs["type"] = number_type(flag, meta["bounds"])
    return kwargs


def add_flags(group, names):
    """Adds the flags `names` to the argparse `group`, each from its field."""
    for name in names:
        field = FIELDS[name]
        group.add_argument(*filter(None, (field.metadata.get("short"), f"--{name}")), **_argument(name, field))


def server_option_values(args):
    """The keyword arguments of `ServerOptions` that its flags set, from `args` (every flag present, as after
    `DEFAULTS`): each field's flag value, its `off` value as None."""
    values = {}
    for field in dataclasses.fields(ServerOptions):
        if "help" in field.metadata:
            value = getattr(args, field.name)
            off = field.metadata["off"]
            values[field.name] = None if off is not None and value == off else value
    return values
