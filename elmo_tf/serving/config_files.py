"""TF Serving's configuration files, read for the embedded server: the model config (`--model_config_file`, a
ModelServerConfig text proto with a model_config_list) and the batching parameters (`--batching_parameters_file`, a
BatchingParameters text proto). Errors are `ValueError`s naming the file and the field.
"""

import logging
import re

logger = logging.getLogger(__name__)

BATCHING_FIELDS = ("max_batch_size", "batch_timeout_micros", "num_batch_threads")
BATCHING_IGNORED = (
    "max_enqueued_batches",
    "pad_variable_length_inputs",
    "allowed_batch_sizes",
    "thread_pool_name",
    "enable_large_batch_splitting",
    "max_execution_batch_size",
)


def parse_batching_parameters(path):
    """{field: int} of max_batch_size, batch_timeout_micros, num_batch_threads from a BatchingParameters text proto;
    the fields the embedded server does not use are logged, unknown ones refused (ValueError)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"#.*", "", f.read())
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e}") from None
    values = {}
    for name, value in re.findall(r"(\w+)\s*\{\s*value\s*:\s*([^\s}]+)\s*\}", text) + re.findall(
        r"(\w+)\s*:\s*([^\s{}]+)", re.sub(r"\w+\s*\{[^}]*\}", "", text)
    ):
        if name in BATCHING_FIELDS:
            try:
                values[name] = int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None
        elif name in BATCHING_IGNORED:
            logger.info(
                "batching parameter %s is not used by the embedded server (it always pads and trims "
                "variable-length inputs)",
                name,
            )
        else:
            raise ValueError(f"unknown field {name!r} in {path!r}")
    return values


def parse_model_config(path):
    """{name: base_path} from a ModelServerConfig text proto (model_config_list); ValueError for a file that cannot
    be read or parsed, an entry without a name or base path, or a platform other than tensorflow."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text_format.Parse(f.read(), config)
    except (OSError, text_format.ParseError) as e:
        raise ValueError(f"cannot read {path!r}: {e}") from None
    models = {}
    for model in config.model_config_list.config:
        if not model.name or not model.base_path:
            raise ValueError(f"every config needs a name and a base_path ({path!r})")
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
