"""elmo_tf/saved_model/warmup.py: TF Serving's warmup file as the ELMo export writes it, read back with TF Serving's own
protos (`tensorflow_serving.apis.prediction_log_pb2`) and TensorFlow's TFRecord reader, each request run through the
reloaded SavedModel against the Keras model's numbers; and the files TF Serving refuses
(tensorflow_serving/servables/tensorflow/saved_model_warmup_util.cc), refused the same way."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2
from tiny_models import TINY

import elmo_tf.saved_model.export as ex
from elmo_tf.saved_model.contract import pack_token_lists
from elmo_tf.saved_model.warmup import (
    MAX_RECORDS,
    WARMUP_SENTENCES,
    WarmupError,
    iter_warmup_requests,
    predict_log,
    predict_request,
    run_warmup_requests,
    warmup_path,
    write_warmup_requests,
)

ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    import keras

    from elmo_tf import BiLMConfig, ELMo

    keras.utils.set_random_seed(0)
    return ELMo(BiLMConfig(**TINY))


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    return ex.export_elmo(model, str(tmp_path_factory.mktemp("models") / "elmo"))


@pytest.fixture(scope="module")
def loaded(exported):
    """`exported` reloaded once with `tf.saved_model.load` (the tests only call its signatures)."""
    return tf.saved_model.load(exported)


def read_with_tf_serving_protos(path):
    """The records of a TFRecord file parsed as TF Serving parses them (PredictionLog.ParseFromArray)."""
    logs = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record.numpy())
        logs.append(log)
    return logs


def test_the_export_writes_one_realistic_request_per_signature_that_runs_as_keras_does(exported, loaded, model):
    # saved_model_warmup_util.cc: io::JoinPath(export_dir, kSavedModelAssetsExtraDirectory, kRequestsFileName)
    path = os.path.join(exported, "assets.extra", "tf_serving_warmup_requests")
    assert warmup_path(exported) == path
    logs = read_with_tf_serving_protos(path)
    names = [log.predict_log.request.model_spec.signature_name for log in logs]
    assert sorted(names) == sorted(loaded.signatures) == ["default", "packed", "serving_default", "tokens"]
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * 4
    token_lists = ex.reference_tokens(WARMUP_SENTENCES)
    lengths = [len(t) for t in token_lists]
    assert len(lengths) == 8 and (min(lengths), max(lengths), sum(lengths)) == (7, 37, 170)  # 21.25 on average
    expected = ex.reference_outputs(model, token_lists)
    for log in logs:
        request = log.predict_log.request
        assert not request.output_filter and not request.model_spec.name  # all outputs; the warmup ignores the name
        inputs = {alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()}
        if request.model_spec.signature_name == "packed":  # the 8 sentences packed as the embedded server packs them
            ((want, _),) = pack_token_lists(token_lists)
            assert sorted(inputs) == sorted(want)
            for alias, value in want.items():
                np.testing.assert_array_equal(inputs[alias], value)
            diffs = ex.check_packed(loaded.signatures["packed"], token_lists, expected)
            assert max(diffs.values()) <= ATOL, diffs
            continue
        if request.model_spec.signature_name == "tokens":
            assert inputs["tokens"].shape == (8, 37) and inputs["sequence_len"].tolist() == lengths
            assert inputs["tokens"][0, : lengths[0]].tolist() == token_lists[0]
        else:
            assert inputs["sentences"].tolist() == [s.encode() for s in WARMUP_SENTENCES]
        out = loaded.signatures[request.model_spec.signature_name](**inputs)
        diffs = ex.compare_outputs(expected, {key: value.numpy() for key, value in out.items()})
        for key, diff in diffs.items():
            assert diff <= (ATOL if expected[key].dtype.kind == "f" else 0), (request.model_spec.signature_name, key)
    assert run_warmup_requests(loaded, exported) == 4


def write_records(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def refusal(path):
    with pytest.raises(WarmupError) as info:
        list(iter_warmup_requests(path))
    return info.value


def test_files_tf_serving_refuses_are_refused_with_its_status(tmp_path):
    path = str(tmp_path / "assets.extra" / "tf_serving_warmup_requests")
    good = predict_log("default", {"sentences": np.array([b"a b"], object)}).SerializeToString()
    # not TFRecord: DATA_LOSS, "Please verify your warmup data is in TFRecord format." (saved_model_warmup_util.cc)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"this is not a TFRecord file at all")
    error = refusal(path)
    assert error.code == "DATA_LOSS" and error.path == path
    assert str(error).endswith(". Please verify your warmup data is in TFRecord format.")
    # a good record, then a truncated one: the good one is read first, then the load fails
    write_records(path, [good])
    with open(path, "ab") as f:
        f.write(open(path, "rb").read()[:-3])
    reader = iter_warmup_requests(path)
    assert next(reader).predict_log.request.model_spec.signature_name == "default"
    with pytest.raises(WarmupError, match="TFRecord format"):
        next(reader)
    # a record that is not a PredictionLog: INVALID_ARGUMENT "Failed to parse warmup record"
    write_records(path, [good, b"\xff\xff\xff"])
    error = refusal(path)
    assert error.code == "INVALID_ARGUMENT" and str(error).startswith("Failed to parse warmup record 2 from ")
    # kMaxNumRecords = 1000: 1000 records are read, the 1001st fails the load
    write_records(path, [good] * MAX_RECORDS)
    assert MAX_RECORDS == 1000 and len(list(iter_warmup_requests(path))) == 1000
    write_records(path, [good] * (MAX_RECORDS + 1))
    error = refusal(path)
    assert error.code == "INVALID_ARGUMENT"
    assert str(error) == f"Number of warmup records exceeds the maximum (1000) at {path}"
    # an empty file is 0 records (ReadRecord's OUT_OF_RANGE at once is OK)
    write_records(path, [])
    assert list(iter_warmup_requests(path)) == []


def test_log_types_are_run_skipped_or_refused_as_tf_serving_does():
    log = prediction_log_pb2.PredictionLog()
    assert predict_request(log) is None  # no log type: RunWarmupRequest's `default: break`
    log.session_run_log.SetInParent()
    with pytest.raises(WarmupError, match="Unsupported log_type for warmup: session_run_log") as info:
        predict_request(log)
    assert info.value.code == "UNIMPLEMENTED"
    log = predict_log("tokens", {"sequence_len": np.array([1], np.int32)})
    assert predict_request(log).model_spec.signature_name == "tokens"


def test_run_refuses_an_unknown_signature_as_predict_util_does(loaded, tmp_path):
    export_dir = str(tmp_path / "copy")
    write_warmup_requests(export_dir, [("nosuch", {"sentences": np.array([b"a"], object)})])
    with pytest.raises(WarmupError, match='Serving signature key "nosuch" not found.') as info:
        run_warmup_requests(loaded, export_dir)
    assert info.value.code == "FAILED_PRECONDITION"  # predict_util.cc
    assert run_warmup_requests(loaded, str(tmp_path / "none")) is None  # no file: nothing to run
    with pytest.raises(ValueError, match="a warmup file holds 1 to 1000 requests, got 0"):
        write_warmup_requests(export_dir, [])


def _masked_crc32c(data):
    """TFRecord's masked CRC-32C of `data` (bitwise; for a header of 8 bytes)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_a_record_declaring_more_bytes_than_the_file_holds_is_refused_before_tensorflow_reads_it(tmp_path):
    """Hostile review (s12): TensorFlow's record reader sizes its buffer from a record's declared length before it
    reads: a 28-byte file whose one header (with a right CRC) declares 2**50 bytes crashed the process
    (SIGSEGV), and with it the version being served. A record that does not fit the file is DATA_LOSS, as TF says of
    a truncated record, before TensorFlow reads it (in a subprocess: without the check the test process dies; forked
    from the worker's fork server, tests/forked.py, a process of its own that starts without importing TensorFlow)."""
    import struct
    import sys

    import forked

    path = str(tmp_path / "assets.extra" / "tf_serving_warmup_requests")
    os.makedirs(os.path.dirname(path))
    good = predict_log("default", {"sentences": np.array([b"a b"], object)}).SerializeToString()
    write_records(path, [good])
    length = struct.pack("<Q", 2**50)
    with open(path, "ab") as f:
        f.write(length + struct.pack("<I", _masked_crc32c(length)) + b"x" * 16)
    script = (
        "import sys\n"
        "from elmo_tf.saved_model.warmup import WarmupError, iter_warmup_requests\n"
        "reader = iter_warmup_requests(sys.argv[1])\n"
        "print(next(reader).predict_log.request.model_spec.signature_name)\n"
        "try:\n"
        "    next(reader)\n"
        "except WarmupError as e:\n"
        "    print(e.code, e)\n"
    )
    done = forked.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "default"
    size = len(good) + 16
    assert lines[1] == (
        f"DATA_LOSS truncated record at {size}: it declares {2**50} bytes, the file holds {size + 28} bytes. "
        "Please verify your warmup data is in TFRecord format."
    )


def test_a_warmup_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """Hostile review (s12): a FIFO (or a symlink to one) as the warmup file blocked the load in TFRecordDataset's read
    for as long as no writer came, and with it every later version of the model (one poller loads them in turn). The
    file (a symlink is followed, as TF Serving follows it) must be a regular file: INVALID_ARGUMENT otherwise."""
    import threading

    path = str(tmp_path / "assets.extra" / "tf_serving_warmup_requests")
    os.makedirs(os.path.dirname(path))
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    os.symlink(fifo, path)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(refusal(path)), daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # let the blocked read end: a writer opens and closes the FIFO
        os.close(os.open(fifo, os.O_WRONLY))
        reader.join(30)
    assert outcome and outcome[0].code == "INVALID_ARGUMENT"
    assert str(outcome[0]) == f"the warmup file {path} is not a regular file"
