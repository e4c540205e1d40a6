"""TF Serving's SavedModel warmup file: `<version>/assets.extra/tf_serving_warmup_requests`, written by the exports and
replayed at load by stock TF Serving and by the embedded server.

The format is TF Serving's (`tensorflow_serving/servables/tensorflow/saved_model_warmup_util.cc`,
`g3doc/saved_model_warmup.md`): a TFRecord file whose records are serialized `tensorflow.serving.PredictionLog`s; ours
hold one `predict_log.request` (a `PredictRequest`: `model_spec.signature_name` and the inputs as TensorProtos, no
model name, which the warmup ignores) per signature. At load TF Serving runs every record once (a failure fails the
load of that version, the version already served stays), and refuses the version when
    - the file is not TFRecord (a bad length or CRC: DATA_LOSS "... Please verify your warmup data is in TFRecord
      format."),
    - a record is not a PredictionLog (INVALID_ARGUMENT "Failed to parse warmup record: ..."),
    - it holds more than `MAX_RECORDS` (1000) records (INVALID_ARGUMENT "Number of warmup records exceeds the maximum
      (1000) at ..."),
    - a record is a session_run_log or predict_streamed_log (UNIMPLEMENTED "Unsupported log_type for warmup"),
    - or a request fails as it would at serving time. A record with no log type is skipped; an empty file is 0 records.
Beyond TF Serving, before TensorFlow reads it: the file must be a regular file (a FIFO would block the load;
INVALID_ARGUMENT), and each record's declared length must fit in the file (TensorFlow sizes its buffer from it: a
header declaring 2**50 bytes crashes the process; DATA_LOSS "truncated record at ..."). The embedded server replays
the requests under its request limits (`elmo_tf.serving.servable.Servable.warm_up`).
This module is below both the exports and the server: it imports neither (TensorFlow, and TF Serving's protos from
the `tensorflow-serving-api` package, only).

What the exports write (`WARMUP_SENTENCES`): 8 sentences of news English (the requests `bench/serving_latency.py`
sends are 8 sentences too), 7 to 37 whitespace tokens, 21 on average: the corpus the benchmarks read has a median of
22 tokens (4 to 62).
"""

import os
import stat
import struct

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ElmoTFError

WARMUP_DIR = "assets.extra"  # tensorflow/cc/saved_model/constants.h: kSavedModelAssetsExtraDirectory
WARMUP_FILE = "tf_serving_warmup_requests"  # WarmupConsts::kRequestsFileName
MAX_RECORDS = 1000  # WarmupConsts::kMaxNumRecords
RECORD_HEADER_BYTES, RECORD_FOOTER_BYTES = 12, 4  # a TFRecord: length (8), its CRC (4), data, the data's CRC (4)
DEFAULT_SIGNATURE = "serving_default"  # an empty signature_name means this one (predict_util.cc)

WARMUP_SENTENCES = (
    "The company said on Tuesday that its profits rose 12 percent in the third quarter , beating analysts ' "
    "forecasts .",
    "Officials in Zürich confirmed the talks would resume next week .",
    "Thousands of people marched through the capital on Saturday to protest against the new tax , which the "
    "government says is needed to cut the deficit .",
    "Police arrested two men after a car bomb exploded near a market in the south of the country .",
    "The United Nations has warned that millions of people face severe food shortages after a second year of "
    "drought across the region , and appealed for more aid .",
    "Oil prices fell sharply on Monday .",
    "The minister told reporters that the agreement , signed after more than a decade of negotiations between the "
    "two neighbours , would open the border to trade and tourism for the first time since the war .",
    "Shares in the bank have lost almost half their value since January , when it announced heavy losses .",
)


class WarmupError(ElmoTFError):
    """A warmup file TF Serving would refuse; `code` is the status it fails the load with ("DATA_LOSS",
    "INVALID_ARGUMENT", "UNIMPLEMENTED", ...: a `grpc.StatusCode` name), `path` the file."""

    def __init__(self, code, message, path=None):
        super().__init__(message, key=WARMUP_FILE, path=path)
        self.code = code


def warmup_path(export_dir):
    """`<export_dir>/assets.extra/tf_serving_warmup_requests`, where TF Serving looks for it."""
    return os.path.join(export_dir, WARMUP_DIR, WARMUP_FILE)


def predict_log(signature_name, inputs):
    """A `PredictionLog` whose `predict_log.request` calls `signature_name` with `inputs` ({alias: array}, strings as
    bytes)."""
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    request = log.predict_log.request
    request.model_spec.signature_name = signature_name
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return log


def write_warmup_requests(export_dir, requests):
    """Writes `assets.extra/tf_serving_warmup_requests` into `export_dir` (a SavedModel directory); returns its path.

    Args:
        requests: `(signature_name, {alias: array})` pairs, one PredictionLog record each, at most `MAX_RECORDS`.
    """
    logs = [predict_log(name, inputs) for name, inputs in requests]
    if not 1 <= len(logs) <= MAX_RECORDS:
        raise ElmoTFError(f"a warmup file holds 1 to {MAX_RECORDS} requests, got {len(logs)}", key="requests")
    path = warmup_path(export_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return path


def sentence_requests(signature_names, sentences=WARMUP_SENTENCES):
    """`(name, {"sentences": array})` for each signature in `signature_names` (the signatures whose one input is a
    batch of sentences)."""
    batch = np.array([s.encode("utf-8") for s in sentences], dtype=object)
    return [(name, {"sentences": batch}) for name in signature_names]


def _open_regular(path):
    """A read-only descriptor of the warmup file at `path` (a symlink followed, as TF Serving follows it), opened
    without blocking and checked to be a regular file: a FIFO or a device would block the load, or never end it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WarmupError("INVALID_ARGUMENT", f"the warmup file {path} is not a regular file", path)
    return fd


def _check_record_fits(fd, offset, path):
    """Offset of the record after the one at `offset`; DATA_LOSS when that record's declared length runs past the end
    of the file. TensorFlow's record reader sizes its buffer from the declared length before reading: a header
    declaring 2**50 bytes crashes the process."""
    size = os.fstat(fd).st_size
    if offset >= size:
        return offset
    header = os.pread(fd, RECORD_HEADER_BYTES, offset)
    length = struct.unpack("<Q", header[:8])[0] if len(header) == RECORD_HEADER_BYTES else None
    end = offset + RECORD_HEADER_BYTES + length + RECORD_FOOTER_BYTES if length is not None else None
    if end is None or end > size:
        declared = f"it declares {length} bytes" if length is not None else "its header is cut"
        raise WarmupError(
            "DATA_LOSS",
            f"truncated record at {offset}: {declared}, the file holds {size} bytes. "
            "Please verify your warmup data is in TFRecord format.",
            path,
        )
    return end


def iter_warmup_requests(path):
    """The `PredictionLog`s of the warmup file at `path`, one by one, refused as TF Serving refuses them (see the
    module docstring; `WarmupError`, raised when the bad record is reached). The file must be a regular file, and
    each record's declared length must fit in it before TensorFlow reads the record; TensorFlow reads the file opened
    here (`/proc/self/fd`), so a file swapped for another after these checks is not read."""
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    fd = _open_regular(path)
    try:
        opened = f"/proc/self/fd/{fd}"
        dataset = tf.data.TFRecordDataset(opened if os.path.exists(opened) else path)
        # no prefetch thread: tf.data's default optimizations may read the next record ahead of `next`, before
        # `_check_record_fits` has checked it (a lying length then crashes the process: seen once under load)
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        records = iter(dataset.with_options(options))
        count, offset = 0, 0
        while True:
            offset = _check_record_fits(fd, offset, path)
            try:
                record = next(records)
            except StopIteration:
                return
            except tf.errors.DataLossError as e:
                raise WarmupError(
                    "DATA_LOSS", f"{e.message}. Please verify your warmup data is in TFRecord format.", path
                ) from None
            count += 1
            if count > MAX_RECORDS:
                raise WarmupError(
                    "INVALID_ARGUMENT", f"Number of warmup records exceeds the maximum ({MAX_RECORDS}) at {path}", path
                )
            log = prediction_log_pb2.PredictionLog()
            try:
                log.ParseFromString(record.numpy())
            except DecodeError:
                raise WarmupError(
                    "INVALID_ARGUMENT", f"Failed to parse warmup record {count} from {path}", path
                ) from None
            yield log
    finally:
        os.close(fd)


def predict_request(log, path=None):
    """The `PredictRequest` of a `PredictionLog`; None for a record without a log type (TF Serving skips it).

    Raises:
        WarmupError: UNIMPLEMENTED for the log types TF Serving's warmup does not run (session_run_log,
            predict_streamed_log) and for those an ELMo export has no signature for (classify_log, regress_log,
            multi_inference_log: TF Serving fails them on a predict-only model).
    """
    kind = log.WhichOneof("log_type")
    if kind is None:
        return None
    if kind != "predict_log":
        raise WarmupError("UNIMPLEMENTED", f"Unsupported log_type for warmup: {kind} (predict_log only)", path)
    return log.predict_log.request


def run_warmup_requests(loaded, export_dir):
    """Runs every request of `export_dir`'s warmup file through `loaded` (`tf.saved_model.load(export_dir)`), as TF
    Serving does at load; returns how many ran (None when the export has no warmup file).

    Raises:
        WarmupError: a file TF Serving refuses, or a signature the SavedModel does not have (FAILED_PRECONDITION,
            predict_util.cc's `Serving signature key "..." not found.`).
        tf.errors.OpError: a request failed.
    """
    path = warmup_path(export_dir)
    if not os.path.exists(path):
        return None
    count = 0
    for log in iter_warmup_requests(path):
        request = predict_request(log, path)
        if request is None:
            continue
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in loaded.signatures:
            raise WarmupError("FAILED_PRECONDITION", f'Serving signature key "{name}" not found.', path)
        loaded.signatures[name](**{alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()})
        count += 1
    return count
