"""TF Serving's configuration files, read for the embedded server: the model config (`--model_config_file`, a
ModelServerConfig text proto with a model_config_list: each model's name, base path, version policy and version
labels, as a `ModelConfig`) and the batching parameters (`--batching_parameters_file`, a BatchingParameters text
proto). Errors are `ValueError`s naming the file and the field. No TensorFlow here: the command line reads these
files before TensorFlow loads.
"""

import dataclasses
import functools
import logging
import os

from elmo_tf.bounds import INT32_MAX, Bounds

logger = logging.getLogger(__name__)

# the longest a held request waits for batch-mates (TF Serving sets no bound; 10^16 microseconds overflowed the batch
# worker's wait, issue 38): a minute is far beyond any batching gain; and the batch threads, each started at once
MAX_BATCH_TIMEOUT = 60.0
MAX_BATCH_THREADS = 1024
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few lines; a larger one is a wrong path, read no further

# the fields the embedded server uses, and their bounds (the same for the file and the flags of the same names)
BATCHING_BOUNDS = {
    "max_batch_size": Bounds(int, 1, INT32_MAX),  # rows of one model call: a tensor dimension
    "batch_timeout_micros": Bounds(
        int, 0, int(MAX_BATCH_TIMEOUT * 1e6), high_note="a minute: a held request waits that long for batch-mates"
    ),
    "num_batch_threads": Bounds(int, 1, MAX_BATCH_THREADS, high_note="a thread each, started at once"),
}


@functools.cache
def batching_parameters_class():
    """TF Serving's BatchingParameters message (tensorflow_serving/servables/tensorflow/session_bundle_config.proto:
    the same names, numbers and types), built from a descriptor in a pool of its own: tensorflow-serving-api ships no
    Python module for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = proto.message_type.add(name="BatchingParameters")
    for name, number, wrapper in (
        ("max_batch_size", 1, "Int64Value"),
        ("batch_timeout_micros", 2, "Int64Value"),
        ("max_enqueued_batches", 3, "Int64Value"),
        ("num_batch_threads", 4, "Int64Value"),
        ("thread_pool_name", 5, "StringValue"),
        ("enable_large_batch_splitting", 8, "BoolValue"),
        ("max_execution_batch_size", 9, "Int64Value"),
    ):
        message.field.add(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            type_name=f".google.protobuf.{wrapper}",
            label=field.LABEL_OPTIONAL,
        )
    message.field.add(name="allowed_batch_sizes", number=6, type=field.TYPE_INT64, label=field.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


@functools.cache
def monitoring_config_class():
    """TF Serving's MonitoringConfig (tensorflow_serving/config/monitoring_config.proto: `prometheus_config { enable
    path }`, the same names, numbers and types), built from a descriptor: tensorflow-serving-api ships no Python
    module for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/monitoring_config.proto", package="tensorflow.serving", syntax="proto3"
    )
    prometheus = proto.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    monitoring = proto.message_type.add(name="MonitoringConfig")
    monitoring.field.add(
        name="prometheus_config",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.serving.PrometheusConfig",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))


def parse_monitoring_config(path):
    """The REST path of the Prometheus metrics from a MonitoringConfig text proto, or None when it does not enable
    them; an empty `path` is stock's default ("/monitoring/prometheus/metrics"). ValueError naming the file for one
    TF Serving would refuse, or a path that is not absolute or lies under /v1/ (the model API's)."""
    from elmo_tf.serving.metrics import DEFAULT_PATH

    config = _read_text_proto(path, monitoring_config_class()())
    if not config.prometheus_config.enable:
        return None
    metrics_path = config.prometheus_config.path or DEFAULT_PATH
    if not metrics_path.startswith("/") or metrics_path.lower().startswith("/v1/"):
        raise ValueError(
            f"{path!r}: prometheus_config.path must start with / and not lie under /v1/, got {metrics_path!r}"
        )
    return metrics_path


@functools.cache
def ssl_config_class():
    """TF Serving's SSLConfig (tensorflow_serving/config/ssl_config.proto: server_key, server_cert, custom_ca,
    client_verify), built from a descriptor: tensorflow-serving-api ships no Python module for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/ssl_config.proto", package="tensorflow.serving", syntax="proto3"
    )
    message = proto.message_type.add(name="SSLConfig")
    for name, number, kind in (
        ("server_key", 1, field.TYPE_STRING),
        ("server_cert", 2, field.TYPE_STRING),
        ("custom_ca", 3, field.TYPE_STRING),
        ("client_verify", 4, field.TYPE_BOOL),
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.SSLConfig"))


def parse_ssl_config(path):
    """An `options.SslConfig` from an SSLConfig text proto holding the PEM contents (stock's --ssl_config_file);
    ValueError naming the file for one stock would refuse, or PEM fields that are missing or not PEM."""
    from elmo_tf.serving.grpc.tls import SslConfig

    config = _read_text_proto(path, ssl_config_class()())
    try:
        return SslConfig(
            server_key=config.server_key.encode(),
            server_cert=config.server_cert.encode(),
            custom_ca=config.custom_ca.encode() or None,
            client_verify=config.client_verify,
        )
    except ValueError as e:
        raise ValueError(f"{path!r}: {e}") from None


def _read_text_proto(path, message):
    """`message` parsed from the text proto file at `path` as TF Serving's ParseProtoTextFile does (protobuf's text
    format: unknown fields, a field given twice, junk are errors); ValueError naming the file and the parser's line."""
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path!r}: {e}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path!r} is over {MAX_CONFIG_BYTES} characters: not a config file")
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise ValueError(f"cannot parse {path!r}: {e}") from None
    return message


def parse_batching_parameters(path):
    """{field: int} of max_batch_size, batch_timeout_micros, num_batch_threads from a BatchingParameters text proto,
    each within `BATCHING_BOUNDS`; the fields the embedded server does not use are logged. ValueError naming the
    file and the field for a file TF Serving would refuse or a value out of bounds."""
    params = _read_text_proto(path, batching_parameters_class()())
    values = {}
    for name, bounds in BATCHING_BOUNDS.items():
        if params.HasField(name):
            value = getattr(params, name).value
            problem = bounds.problem(value)
            if problem:
                raise ValueError(f"{name} in {path!r} {problem}")
            values[name] = value
    for descriptor, _ in params.ListFields():
        if descriptor.name not in BATCHING_BOUNDS:
            logger.info(
                "batching parameter %s is not used by the embedded server (it always pads and trims "
                "variable-length inputs)",
                descriptor.name,
            )
    return values


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which versions under a base path are served: TF Serving's ServableVersionPolicy
    (config/file_system_storage_path_source.proto), applied by `source.FileSystemSource.candidates`.

    Args:
        kind: "latest" (the `num_versions` highest versions on disk; TF Serving's default, with 1), "all" (every
            version on disk) or "specific" (the `versions` listed that are on disk; none listed: none served).
        num_versions: for "latest", how many (>= 1; the proto's 0 means 1, as `std::max(num_versions, 1U)` in
            file_system_storage_path_source.cc `AspireLatestVersions`).
        versions: for "specific", the version numbers (ints).
    """

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple = ()

    def __post_init__(self):
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(f"kind must be 'latest', 'all' or 'specific', got {self.kind!r}")
        if isinstance(self.num_versions, bool) or not isinstance(self.num_versions, int) or self.num_versions < 1:
            raise ValueError(f"num_versions must be an int >= 1, got {self.num_versions!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in self.versions):
            raise ValueError(f"versions must be ints, got {self.versions!r}")
        object.__setattr__(self, "versions", tuple(self.versions))

    @classmethod
    def from_proto(cls, policy):
        """The policy of a ServableVersionPolicy message (none chosen: latest 1, as stock's POLICY_CHOICE_NOT_SET)."""
        kind = policy.WhichOneof("policy_choice") or "latest"
        if kind == "latest":
            return cls("latest", num_versions=max(policy.latest.num_versions, 1))
        return cls(kind, versions=tuple(policy.specific.versions) if kind == "specific" else ())

    def __str__(self):
        """The policy as its text proto: `latest { num_versions: 2 }`, `all {}`, `specific { versions: [1, 5] }`."""
        if self.kind == "latest":
            return f"latest {{ num_versions: {self.num_versions} }}"
        if self.kind == "all":
            return "all {}"
        return f"specific {{ versions: [{', '.join(map(str, self.versions))}] }}"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model of a model_config_list, as the embedded server serves it.

    Args:
        name: the model name clients ask for.
        base_path: the directory holding `<version>/saved_model.pb`.
        version_policy: `VersionPolicy` (latest 1 by default).
        version_labels: `{label: version}` (`model_spec.version_label`, REST's `/labels/<label>`).
    """

    name: str
    base_path: str
    version_policy: VersionPolicy = VersionPolicy()
    version_labels: dict = dataclasses.field(default_factory=dict)


def model_config(name, value):
    """`value` as a `ModelConfig` of model `name`: a `ModelConfig` as it is, a base path (str or path-like) with the
    default policy and no labels."""
    if isinstance(value, ModelConfig):
        if value.name != name:
            raise ValueError(f"the ModelConfig of model {name!r} is named {value.name!r}")
        return value
    return ModelConfig(name, os.fspath(value))


def check_version_labels(configs, allow_unavailable, path=None, available=None):
    """`{model name: {label: version}}` of `configs` (`ModelConfig`s), refused as stock refuses labels at start-up.

    server_core.cc UpdateModelVersionLabelMap, run by ServerCore::ReloadConfig before any model loads:
    a label must point at a version that is AVAILABLE, which at start-up none is, so every label is refused
    (FAILED_PRECONDITION "Request to assign label to version 1 of model m, which is not currently available for
    inference"; main.cc's `main` exits) unless `allow_unavailable` (stock's
    --allow_version_labels_for_unavailable_models, main.cc `main`): then every label is taken, whatever its version
    (a request by a label whose version is not AVAILABLE is NOT_FOUND). ValueError naming the model, the label and
    `path` (the config file) when given. A reload (`core.ServerCore.reload`) passes `available(name, version)`, True
    for an AVAILABLE version of a model already served: such a label is taken.
    """
    labels = {}
    for config in configs:
        for label, version in sorted(config.version_labels.items()):
            if not allow_unavailable and not (available is not None and available(config.name, version)):
                where = f" in {path!r}" if path else ""
                why = "no version is loaded at start-up" if available is None else "that version is not AVAILABLE"
                raise ValueError(
                    f"Request to assign label to version {version} of model {config.name}, which is not currently "
                    f'available for inference (version_labels {{ key: "{label}" value: {version} }} of model '
                    f"{config.name}{where}: {why}; --allow_version_labels_for_unavailable_models allows it)"
                )
            labels.setdefault(config.name, {})[label] = version
    return labels


def _is_relative_path(base_path):
    """As server_core.cc's UriIsRelativePath: no scheme (`gs://`, `s3://`, `file://`) and not an absolute path."""
    return "://" not in base_path and not base_path.startswith("/")


def _model_config_of(entry, path):
    """The `ModelConfig` of one ModelConfig message; ValueError naming `path` (when given) for an entry stock
    refuses."""
    where = f" ({path!r})" if path else ""
    if not entry.name or not entry.base_path:
        raise ValueError(f"every config needs a name and a base_path{where}")
    if _is_relative_path(entry.base_path):
        raise ValueError(
            f"Expected model {entry.name} to have an absolute path or URI; got base_path()={entry.base_path}{where}"
        )
    if entry.model_platform not in ("", "tensorflow"):
        raise ValueError(f"model_platform {entry.model_platform!r} is not supported")
    return ModelConfig(
        entry.name,
        entry.base_path,
        VersionPolicy.from_proto(entry.model_version_policy),
        dict(entry.version_labels),
    )


def parse_model_config(path, allow_version_labels_for_unavailable_models=False):
    """{name: `ModelConfig`} from a ModelServerConfig text proto (model_config_list), validated as TF Serving validates
    it at start-up: protobuf's text format (a misspelt field, two policies, a negative num_versions are parse errors);
    server_core.cc ValidateModelConfigList: a name listed twice and a relative base_path are refused with
    stock's messages; version labels as `check_version_labels`. ValueError also for a file that cannot be read or
    parsed, an entry without a name or base path, or a platform other than tensorflow.

    What stock takes, this takes: `latest { num_versions: 0 }` is latest 1; an empty `specific {}` serves nothing
    (the source warns, file_system_storage_path_source.cc `AspireSpecificVersionsFastPath`); a specific version not on
    disk is a warning.
    """
    from tensorflow_serving.config import model_server_config_pb2

    config = _read_text_proto(path, model_server_config_pb2.ModelServerConfig())
    models = models_of_config(config, path)
    if allow_version_labels_for_unavailable_models is not None:  # None: a reload, whose labels the core checks
        check_version_labels(models.values(), allow_version_labels_for_unavailable_models, path)
    return models


def models_of_config(config, path=None):
    """{name: `ModelConfig`} of a ModelServerConfig message's model_config_list, checked as server_core.cc's
    ValidateModelConfigList (a name listed twice, a relative base_path, an entry without a name or a base path, a
    platform other than tensorflow: ValueError with stock's message, naming `path` when given). Labels unchecked."""
    if config.WhichOneof("config") not in (None, "model_config_list"):
        raise ValueError(
            "ServerModelConfig type not supported by HandleReloadConfigRequest. Only ModelConfigList is currently "
            "supported"
        )
    entries = config.model_config_list.config
    names = set()
    for entry in entries:  # every name first, then every path, as ValidateModelConfigList
        if entry.name in names:
            where = f" ({path!r})" if path else ""
            raise ValueError(f"Illegal to list model {entry.name} multiple times in config list{where}")
        names.add(entry.name)
    models = {entry.name: _model_config_of(entry, path) for entry in entries}
    if not models:
        raise ValueError("no model_config_list entries" + (f" in {path!r}" if path else ""))
    return models
