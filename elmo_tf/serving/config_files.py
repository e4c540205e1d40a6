"""TF Serving's configuration files, read for the embedded server: the model config (`--model_config_file`, a
ModelServerConfig text proto with a model_config_list) and the batching parameters (`--batching_parameters_file`, a
BatchingParameters text proto). Errors are `ValueError`s naming the file and the field.
"""

import functools
import logging

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
BATCHING_FIELDS = tuple(BATCHING_BOUNDS)


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


def _is_relative_path(base_path):
    """As server_core.cc's UriIsRelativePath: no scheme (`gs://`, `s3://`, `file://`) and not an absolute path."""
    return "://" not in base_path and not base_path.startswith("/")


def parse_model_config(path):
    """{name: base_path} from a ModelServerConfig text proto (model_config_list), validated as TF Serving's
    server_core.cc ValidateModelConfigList does: a name listed twice and a relative base_path are refused (stock's
    messages). ValueError also for a file that cannot be read or parsed, an entry without a name or base path, or a
    platform other than tensorflow."""
    from tensorflow_serving.config import model_server_config_pb2

    config = _read_text_proto(path, model_server_config_pb2.ModelServerConfig())
    models = {}
    for model in config.model_config_list.config:
        if not model.name or not model.base_path:
            raise ValueError(f"every config needs a name and a base_path ({path!r})")
        if model.name in models:
            raise ValueError(f"Illegal to list model {model.name} multiple times in config list ({path!r})")
        if _is_relative_path(model.base_path):
            raise ValueError(
                f"Expected model {model.name} to have an absolute path or URI; got base_path()={model.base_path} "
                f"({path!r})"
            )
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(f"model_platform {model.model_platform!r} is not supported")
        if model.HasField("model_version_policy"):
            logger.warning(
                "model %s: model_version_policy is ignored; the embedded server serves the latest version", model.name
            )
        models[model.name] = model.base_path
    if not models:
        raise ValueError(f"no model_config_list entries in {path!r}")
    return models
