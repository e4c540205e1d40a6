"""elmo_tf/pretraining in-process: building a Trainer does no I/O, the loop calls Keras callbacks (hooks, logs,
`model.stop_training`, interrupts), and the run directory's files are written atomically.

The model is tests/tiny_models.TINY on 24 short made-up sentences; each test builds its own Trainer (about a
second) and trains a handful of steps. The command line around the same code: tests/cli/test_pretrain.py.
"""

import builtins
import gc
import hashlib
import math
import os
import weakref

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_testlib import file_size_limit
from tiny_models import TINY

from elmo_tf.bounds import MAX_BUFFER
from elmo_tf.config import BiLMConfig, ConfigError, field_flag
from elmo_tf.io import build_vocabulary, count_words
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.preprocessing.lm_dataset import LMDataError
from elmo_tf.pretraining import (
    STOP_REASONS,
    Checkpoints,
    TrainConfig,
    Trainer,
    count_steps,
    run_pretraining,
    write_model_dir,
)

MODEL_FILES = ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("loop_corpus")
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(2, 6))) for _ in range(30)]
    lines = [" ".join(rng.choice(words, size=rng.integers(3, 7))) for _ in range(24)]
    (d / "train.txt").write_text("\n".join(lines) + "\n")
    vocab = build_vocabulary(count_words([str(d / "train.txt")]))
    return {"train": str(d / "train.txt"), "vocab": vocab}


def make_trainer(corpus, train_files=None, valid_files=None, **train):
    config = dict(batch_size=8, num_sampled=8, optimizer="adam", learning_rate=0.01, dropout=0.0, steps=6)
    config.update(train)
    return Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        BiLMConfig(**TINY),
        TrainConfig(**config),
        corpus["vocab"],
        train_files or [corpus["train"]],
        valid_files=valid_files,
    )


def temporaries(directory):
    return [p for p in os.listdir(directory) if ".tmp-" in p]


class Recorder(keras.callbacks.Callback):
    """Every hook call: (hook, epoch/batch index, sorted log keys); the logs of each epoch end and train end."""

    def __init__(self):
        super().__init__()
        self.calls, self.epoch_logs, self.end_logs = [], [], None

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin", None, sorted(logs)))
        self.begin_params = dict(self.params)

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch, sorted(logs or {})))

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("batch_begin", batch, sorted(logs or {})))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch, sorted(logs)))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, sorted(logs)))
        self.epoch_logs.append(dict(logs))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end", None, sorted(logs)))
        self.end_logs = dict(logs)


class StopAtStep(keras.callbacks.Callback):
    """Sets `model.stop_training` (the Keras convention) after step `step`."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.step:
            self.model.stop_training = True


class InterruptAtStep(keras.callbacks.Callback):
    def __init__(self, step, error):
        super().__init__()
        self.step, self.error = step, error

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.step:
            raise self.error


# ----------------------------------------------------------------------------------------------- no I/O
def test_building_a_trainer_touches_no_file(corpus, tmp_path, monkeypatch):
    missing = tmp_path / "not_yet" / "train.txt"  # its directory does not exist
    calls = []

    def refuse(name):
        def call(*args, **kwargs):
            calls.append((name, args))
            raise AssertionError(f"{name}{args} while building")

        return call

    for module, name in ((builtins, "open"), (os, "open"), (os, "makedirs"), (os, "mkdir"), (os, "replace")):
        monkeypatch.setattr(module, name, refuse(name))
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)  # a relative write would land here
    trainer = make_trainer(corpus, train_files=[str(missing)], valid_files=[str(tmp_path / "nor_this.txt")])
    checkpoints = Checkpoints(trainer, tmp_path / "run")  # reads a checkpoint state file if there is one
    monkeypatch.undo()
    assert calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run dir, no not_yet/
    assert checkpoints.latest is None and trainer.model.built and int(trainer.step.numpy()) == 0
    # the data is read when the dataset is iterated: that is where a missing file shows
    with pytest.raises(tf.errors.NotFoundError, match="not_yet"):
        next(iter(trainer.distributed_dataset(0)))
    assert not missing.parent.exists()


def test_a_string_where_a_list_of_files_belongs_is_refused(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"valid_files must be a list of file paths, got '.*run'"):
        make_trainer(corpus, valid_files=str(tmp_path / "run"))  # the output dir of the old signature
    with pytest.raises(ValueError, match="train_files must be a list of file paths"):
        make_trainer(corpus, train_files=corpus["train"])


# ------------------------------------------------------------------------------------------- callbacks
def test_callbacks_receive_the_hooks_and_logs(corpus):
    trainer = make_trainer(corpus, valid_files=[corpus["train"]])
    recorder = Recorder()
    result = trainer.fit(7, callbacks=[recorder], log_every=3, validate_every=6)

    hooks = [(hook, index) for hook, index, _ in recorder.calls]
    expected = [("train_begin", None)]
    for begin, end in ((1, 3), (4, 6), (7, 7)):  # windows of log_every steps; the last one cut at total_steps
        expected.append(("epoch_begin", end))
        for step in range(begin, end + 1):
            expected += [("batch_begin", step), ("batch_end", step)]
        expected.append(("epoch_end", end))
    expected.append(("train_end", None))
    assert hooks == expected
    assert recorder.calls[0][2] == ["elapsed_minutes", "step"]
    batch_keys = {tuple(keys) for hook, _, keys in recorder.calls if hook == "batch_end"}
    assert batch_keys == {("elapsed_minutes", "loss", "step", "tokens")}
    window = ["elapsed_minutes", "loss", "perplexity", "step", "tokens_per_s"]
    assert [sorted(logs) for logs in recorder.epoch_logs] == [window, sorted(window + ["val_perplexity"]), window]
    assert [logs["step"] for logs in recorder.epoch_logs] == [3, 6, 7]
    for logs in recorder.epoch_logs:
        assert math.isclose(logs["perplexity"], math.exp(logs["loss"]), rel_tol=1e-6)
        assert 0 < logs["loss"] < 10 and logs["tokens_per_s"] > 0
    minutes = [logs["elapsed_minutes"] for logs in recorder.epoch_logs]
    assert 0 < minutes[0] < minutes[1] < minutes[2]
    assert 1 < recorder.epoch_logs[1]["val_perplexity"] < 2 * len(corpus["vocab"])
    assert recorder.end_logs["stop_reason"] == "steps" and recorder.end_logs["step"] == 7
    assert recorder.model is trainer.model
    assert recorder.begin_params["total_steps"] == 7 and recorder.begin_params["initial_step"] == 0
    assert result["step"] == 7 and result["stop_reason"] == "steps"
    assert math.isclose(trainer.train_seconds.numpy() / 60, minutes[-1], rel_tol=1e-9)

    # a second fit continues from step 7 with the training time so far
    again = Recorder()
    trainer.fit(8, callbacks=[again], log_every=3)
    assert [(h, i) for h, i, _ in again.calls if h.startswith("epoch")] == [("epoch_begin", 8), ("epoch_end", 8)]
    assert again.epoch_logs[0]["elapsed_minutes"] > minutes[-1]


def test_stop_training_ends_the_run_with_the_model_dir_written(corpus, tmp_path):
    trainer = make_trainer(corpus, checkpoint_every=1000)
    out = tmp_path / "run"
    recorder = Recorder()
    callbacks = [StopAtStep(2), recorder]
    result = run_pretraining(trainer, Checkpoints(trainer, out), 50, callbacks=callbacks, progress=False)
    assert result["step"] == 2 and result["stop_reason"] == "stop_training"
    assert recorder.end_logs["stop_reason"] == "stop_training"
    assert [logs["step"] for logs in recorder.epoch_logs] == [2]  # the cut window is closed and logged
    for name in (*MODEL_FILES, "metrics.json", "train_config.json", "log.csv"):
        assert (out / name).is_file(), name
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-2")
    assert (out / "log.csv").read_text().splitlines()[-1].startswith("2,2,")
    assert temporaries(out) == []


def test_an_interrupt_saves_a_checkpoint_an_error_does_not(corpus, tmp_path):
    trainer = make_trainer(corpus, checkpoint_every=1000)
    out = tmp_path / "run"
    checkpoints = Checkpoints(trainer, out)
    recorder = Recorder()
    iterators, batches = [], trainer.distributed_dataset

    class Recorded:  # the run's batches, whose iterator this test watches
        def __init__(self, start_step):
            self.dataset = batches(start_step)

        def __iter__(self):
            iterator = iter(self.dataset)
            iterators.append(weakref.ref(iterator))
            return iterator

    trainer.distributed_dataset = Recorded
    gc.disable()  # what the error leaves behind is freed at once, not by a later collection
    try:
        with pytest.raises(RuntimeError, match="boom") as error:
            callbacks = [InterruptAtStep(2, RuntimeError("boom")), recorder]
            run_pretraining(trainer, checkpoints, 50, callbacks=callbacks, progress=False)
        # the input pipeline (and its threads) went with the run, though the error's traceback keeps its frames
        assert error.tb is not None and len(iterators) == 1 and iterators[0]() is None
    finally:
        gc.enable()
    del trainer.distributed_dataset
    assert recorder.end_logs["stop_reason"] == "error"
    assert checkpoints.latest is None  # a bug is not a reason to checkpoint

    # Ctrl-C (SIGTERM arrives as SystemExit through elmo_tf.cli and takes the same path: tests/cli/test_pretrain.py)
    with pytest.raises(KeyboardInterrupt):
        callbacks = [InterruptAtStep(3, KeyboardInterrupt()), recorder]
        run_pretraining(trainer, checkpoints, 50, callbacks=callbacks, progress=False)
    assert recorder.end_logs["stop_reason"] == "interrupted" and "interrupted" in STOP_REASONS
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-3")
    assert not (out / "weights.hdf5").exists()  # interrupted: no model dir
    resumed = make_trainer(corpus)
    assert Checkpoints(resumed, out).restore() and int(resumed.step.numpy()) == 3


# -------------------------------------------------------------------------------------------- atomic
@pytest.fixture
def two_models(tmp_path):
    """A model dir written from one model, and a second model (other options, weights and vocabulary)."""
    words_a = ["<S>", "</S>", "<UNK>", "the", "cat"]
    first = BiLMPretrainer(BiLMConfig(**TINY), len(words_a), dropout=0.0)
    out = tmp_path / "model"
    write_model_dir(first, Vocabulary(words_a), out)
    words_b = [*words_a, "sat"]
    second = BiLMPretrainer(BiLMConfig(**dict(TINY, cell_clip=2.0)), len(words_b), dropout=0.0)
    digests = {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in MODEL_FILES}
    return out, second, Vocabulary(words_b), digests


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", MODEL_FILES)
def test_a_write_stopped_before_the_rename_keeps_the_previous_file(two_models, monkeypatch, name):
    out, model, vocab, before = two_models
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == name:
            raise SystemExit(143)  # SIGTERM through elmo_tf.cli, with the new file complete under its temporary
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(SystemExit):
        write_model_dir(model, vocab, out)
    assert digest(out / name) == before[name]
    assert temporaries(out) == []
    monkeypatch.undo()
    write_model_dir(model, vocab, out)  # and a later write replaces it
    assert digest(out / name) != before[name]


def test_a_writer_failing_midway_keeps_the_previous_weights(two_models, monkeypatch):
    out, model, vocab, before = two_models
    real_create = h5py.Group.create_dataset
    created = []

    def create_dataset(self, name, *args, **kwargs):
        created.append(name)
        if len(created) == 3:  # two datasets of the new weights written, then the writer fails
            raise OSError("disk full")
        return real_create(self, name, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", create_dataset)
    with pytest.raises(OSError, match="disk full"):
        write_model_dir(model, vocab, out)
    assert digest(out / "weights.hdf5") == before["weights.hdf5"]
    assert digest(out / "softmax.hdf5") == before["softmax.hdf5"]  # not reached
    assert digest(out / "options.json") != before["options.json"]  # written whole before the weights
    assert temporaries(out) == []


def test_a_full_disk_keeps_the_previous_weights_and_names_the_file(two_models, capfd):
    """A real refusal (a file-size limit below the new weights.hdf5: EFBIG, as a full disk gives ENOSPC): WriteError
    naming weights.hdf5, the previous weights and softmax kept, no temporary, no h5py "Exception ignored" storm."""
    from elmo_tf.io.atomic import WriteError

    out, model, vocab, before = two_models
    limit = (out / "weights.hdf5").stat().st_size // 2  # options.json (under 1 kB) fits, weights.hdf5 does not
    with pytest.raises(WriteError) as caught, file_size_limit(limit):
        write_model_dir(model, vocab, out)
    assert caught.value.filename == str(out / "weights.hdf5") and "File too large" in str(caught.value)
    assert digest(out / "weights.hdf5") == before["weights.hdf5"]
    assert digest(out / "softmax.hdf5") == before["softmax.hdf5"]
    assert temporaries(out) == []
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.slow
def test_bfloat16_matmul_precision_trains_float32_weights(corpus):
    """TrainConfig.matmul_precision="bfloat16" reaches the model; steps stay finite, the weights, their updates and
    the optimizer's slots stay float32."""
    trainer = make_trainer(corpus, matmul_precision="bfloat16")
    assert trainer.model.matmul_dtype == "bfloat16"
    assert make_trainer(corpus).model.matmul_dtype is None
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    iterator = iter(trainer.distributed_dataset(0))
    for _ in range(3):
        fwd, bwd, count = (float(t) for t in trainer.train_step(iterator))
        assert math.isfinite(fwd / count) and math.isfinite(bwd / count) and count > 0
    after = trainer.model.trainable_variables
    assert all(v.dtype == "float32" for v in after + trainer.optimizer.variables if "int" not in v.dtype)
    assert sum(not np.array_equal(a, b.numpy()) for a, b in zip(before, after)) == len(before)


def test_a_bad_matmul_precision_is_named():
    with pytest.raises(ValueError, match=r"matmul_precision must be one of \('float32', 'bfloat16'\), got 'fp16'"):
        TrainConfig(steps=1, matmul_precision="fp16")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("batch_size", 0, "batch_size must be >= 1, got 0"),
        ("batch_size", 10**12, f"batch_size must be <= {MAX_BUFFER} (tf.data reserves memory"),
        ("batch_size", 8.0, "batch_size must be an int, got 8.0"),
        ("max_tokens", 2**31, "max_tokens must be <= 2147483647 (int32), got 2147483648"),
        ("steps", -1, "steps must be >= 0, got -1"),
        ("epochs", math.inf, "epochs must be a finite number, got inf"),
        ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
        ("learning_rate", math.nan, "learning_rate must be a finite number, got nan"),
        ("learning_rate", "0.1", "learning_rate must be a number, got '0.1'"),
        ("clip_norm", -1.0, "clip_norm must be >= 0, got -1.0"),
        ("dropout", 1.0, "dropout must be < 1, got 1.0"),
        ("num_sampled", 0, "num_sampled must be >= 1, got 0"),
        ("checkpoint_every", 2**63, "checkpoint_every must be <= 9223372036854775807 (int64)"),
        ("log_every", 0, "log_every must be >= 1, got 0"),
        ("validate_every", -1, "validate_every must be >= 0, got -1"),
        ("shuffle_buffer", -1, "shuffle_buffer must be >= 0, got -1"),
        ("bucket_width", 0, "bucket_width must be >= 1, got 0"),
        ("seed", -1, "seed must be >= 0, got -1"),
        ("seed", 2**32, "seed must be <= 4294967295 (numpy's seeds are 0 <= seed < 2**32), got 4294967296"),
        ("optimizer", "adamw", "optimizer must be one of ('adagrad', 'adam', 'sgd'), got 'adamw'"),
    ],
)
def test_train_config_errors_name_the_field_and_its_flag(field, value, message):
    """Library users get the ranges of the command line: a ConfigError whose key is the field (the message starts
    with it), and the field's flag beside the dataclass."""
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{"steps": 1, field: value})
    assert info.value.key == field and str(info.value).startswith(message), str(info.value)
    assert field_flag(TrainConfig, field) == "--" + field.replace("_", "-")


def test_train_config_needs_steps_or_epochs():
    with pytest.raises(ConfigError, match=r"^steps or epochs must be > 0, got steps=0, epochs=0") as info:
        TrainConfig()
    assert info.value.key == "steps" and field_flag(TrainConfig, "steps") == "--steps"
    assert TrainConfig(epochs=0.5).epochs == 0.5 and TrainConfig(steps=2**63 - 1, seed=2**32 - 1).seed == 2**32 - 1


def test_epochs_beyond_int64_steps_are_named(corpus):
    """`count_steps` turned 1e308 epochs into inf steps and `math.ceil` raised OverflowError."""
    assert count_steps(TrainConfig(epochs=2.0, batch_size=8), [corpus["train"]]) == 6  # 24 sentences
    with pytest.raises(ConfigError, match=r"^epochs of 1e\+308 are inf steps, more than an int64 counts") as info:
        count_steps(TrainConfig(epochs=1e308, batch_size=1), [corpus["train"]])
    assert field_flag(TrainConfig, info.value.key) == "--epochs"


def test_the_probe_batch_of_blank_training_files_names_them(corpus, tmp_path):
    """`first_batch` (the checkpoints' probe batch) raised a bare StopIteration on a corpus of blank lines."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n" * 10)
    trainer = make_trainer(corpus, train_files=[str(blank)])
    with pytest.raises(LMDataError, match=f"no tokens in the training files \\({str(blank)!r}\\)") as info:
        trainer.first_batch()
    assert info.value.files == [str(blank)]


def test_bfloat16_on_a_cpu_without_it_warns(corpus, monkeypatch, caplog):
    from elmo_tf import machine

    monkeypatch.setattr(machine, "has_native_bfloat16", lambda: False)
    with caplog.at_level("WARNING", logger="elmo_tf.pretraining"):
        make_trainer(corpus)
        assert "AVX512_BF16" not in caplog.text
        make_trainer(corpus, matmul_precision="bfloat16")
    assert "matmul_precision bfloat16 on a CPU without AVX512_BF16 or AMX" in caplog.text
