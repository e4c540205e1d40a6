"""training/pretrain.py and elmo_tf/pretraining: loss falls, 2 replicas, 2 workers, kill -9 and resume, SIGTERM
saves and resumes, --max-minutes, the exported weights.hdf5 reproduces the in-memory model, perplexity on the
training sentences, NaN stop, --init-from, bad arguments. (The loop, its callbacks and the atomic writes
in-process: tests/pretraining/test_loop.py.)

Every run is a tiny model (char filters 8+8+16, 1 highway, LSTM 64 -> 16, 2 layers) on 40 short sentences
written into a temporary directory, so a run is mostly process start-up. Every subprocess has a timeout so
a hang (a stuck collective, a run that never stops) fails the test instead of blocking CI. Runs are shared where a test
only reads or resumes one: `trained` (the CLI, 200 steps) and `resumable` (in-process, 4 steps) are trained once per
module, and a test that writes into one takes a copy (`copy_run`). kill -9 and SIGTERM are raised inside the run at the
end of a given step (`SIGNAL_AT_STEP`), so the runs are as short as the path needs, on any machine.
"""

import csv
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import forked
import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_testlib import assert_ends_with_one_error, assert_one_error, limit_file_size

from elmo_tf.config import BiLMConfig
from elmo_tf.io import build_vocabulary, count_words, weight_map
from elmo_tf.models import ELMo, load_elmo
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.preprocessing.chars import tokens_to_char_ids_numpy
from elmo_tf.pretraining import (
    CheckpointMismatchError,
    Checkpoints,
    NonFiniteLossError,
    TrainConfig,
    Trainer,
    evaluate_perplexity,
    run_pretraining,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
EVALUATE = REPO_ROOT / "training" / "evaluate_lm.py"
ALLENNLP = REPO_ROOT.parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
TIMEOUT = 300  # seconds for one run of the CLI; the tiny runs take 10-30 s on 2 busy cores

TINY_OPTIONS = {
    "lstm": {
        "dim": 64,
        "projection_dim": 16,
        "n_layers": 2,
        "cell_clip": 3,
        "proj_clip": 3,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 8], [2, 8], [3, 16]],
        "n_highway": 1,
        "activation": "relu",
        "max_characters_per_token": 50,
        "n_characters": 262,
    },
}
# Adam at 0.02 without dropout memorizes the 40 sentences in ~200 steps (loss 2.9 -> 0.7, perplexity ~5 of
# a 93-word vocabulary); Adagrad's default 0.2 needs several times more steps.
FAST = ["--batch-size", "16", "--num-sampled", "16", "--optimizer", "adam", "--learning-rate", "0.02", "--dropout", "0"]


def subprocess_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def run_cli(script, *args, timeout=TIMEOUT, env=None):
    return forked.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=REPO_ROOT,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_pretrain(data, output, *args, config=None, timeout=TIMEOUT, env=None):
    return run_cli(
        PRETRAIN,
        "--train",
        data["train"],
        "--vocab",
        data["vocab"],
        "--config",
        config or data["options"],
        "--output",
        output,
        *args,
        timeout=timeout,
        env=env,
    )


def pretrain_command(data, output, *args):
    """The training/pretrain.py command line on the test data (for tests that start it with Popen)."""
    base = ["--train", data["train"], "--vocab", data["vocab"], "--config", data["options"], "--output", output]
    return [sys.executable, str(PRETRAIN), *map(str, base), *map(str, args)]


# `python -c SIGNAL_AT_STEP STEP SIGNAL SCRIPT ARGS...`: SCRIPT run as `python SCRIPT ARGS...` runs it, with one more
# Keras callback in its run that raises SIGNAL in the process at the end of step STEP: a signal mid-run at a point
# that does not depend on the machine's speed (instead of a test polling for a file and sending it from outside).
SIGNAL_AT_STEP = """
import runpy, signal, sys
import keras
import elmo_tf.pretraining as pretraining
step, name = int(sys.argv[1]), sys.argv[2]
class RaiseSignal(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == step:
            signal.raise_signal(getattr(signal, name))
run_pretraining = pretraining.run_pretraining
def run_with_signal(*args, callbacks=None, **kwargs):
    return run_pretraining(*args, callbacks=[*(callbacks or []), RaiseSignal()], **kwargs)
pretraining.run_pretraining = run_with_signal
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def signalled_at_step(command, step, signal_name):
    """`command` (`[python, SCRIPT, ARGS...]`, a pretraining command) with `signal_name` raised at the end of `step`."""
    return [command[0], "-c", SIGNAL_AT_STEP, str(step), signal_name, *command[1:]]


def run_command(command, **kwargs):
    """`command` run to completion (forked), stdout and stderr captured as text."""
    return forked.run(
        command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT, **kwargs
    )


LOG_COLUMNS = ["epoch", "step", "loss", "perplexity", "tokens_per_s", "elapsed_minutes", "val_perplexity"]


def read_log(output):
    """The header of log.csv and its (step, loss) rows (keras.callbacks.CSVLogger: `epoch` = the step)."""
    with open(Path(output) / "log.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert all(r["epoch"] == r["step"] for r in rows), rows
    return reader.fieldnames, [(int(r["step"]), float(r["loss"])) for r in rows]


def done_line(stderr):
    """`done: step N, train loss X (perplexity Y)` without the tokens/s, which differs between processes."""
    match = re.search(r"done: step \d+, train loss [-\d.naif]+ \(perplexity [-\d.naif]+\)", stderr)
    assert match, stderr[-3000:]
    return match.group(0)


def write_sentences(path, n_sentences=40, n_words=100, seed=0):
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = sorted({"".join(rng.choice(letters, size=rng.integers(3, 8))) for _ in range(n_words)})
    lines = [" ".join(rng.choice(words, size=rng.integers(4, 9))) for _ in range(n_sentences)]
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """40 sentences over ~90 made-up words, their vocabulary and the tiny options.json."""
    d = tmp_path_factory.mktemp("corpus")
    lines = write_sentences(d / "train.txt")
    vocab = build_vocabulary(count_words([str(d / "train.txt")]))
    vocab.save(str(d / "vocab.txt"))
    (d / "options.json").write_text(json.dumps(TINY_OPTIONS))
    return {
        "dir": d,
        "train": d / "train.txt",
        "vocab": d / "vocab.txt",
        "options": d / "options.json",
        "lines": lines,
        "vocab_size": len(vocab),
        "words": vocab,
    }


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """One 200-step run of the CLI on the default strategy (MirroredStrategy over the one CPU), logging
    every step: shared by the loss, perplexity and --init-from tests."""
    out = tmp_path_factory.mktemp("trained") / "run"
    proc = run_pretrain(data, out, "--steps", 200, "--log-every", 1, "--checkpoint-every", 100, *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": out, "stderr": proc.stderr}


def assert_model_dir(out):
    for name in (
        "options.json",
        "weights.hdf5",
        "softmax.hdf5",
        "vocab.txt",
        "metrics.json",
        "train_config.json",
        "log.csv",
    ):
        assert (Path(out) / name).is_file(), f"{name} missing in {out}"
    assert list((Path(out) / "tensorboard").iterdir()), "no TensorBoard events"
    assert json.loads((Path(out) / "options.json").read_text()) == BiLMConfig.from_options(TINY_OPTIONS).to_options()


# (a) ---------------------------------------------------------------------------------------------------
def test_loss_falls_on_a_small_corpus(trained, data):
    header, rows = read_log(trained["dir"])
    assert header == LOG_COLUMNS
    steps = [s for s, _ in rows]
    assert steps == list(range(1, 201))
    losses = np.array([loss for _, loss in rows])
    first, last = losses[:10].mean(), losses[-10:].mean()
    # sampled softmax over 16 negatives + the target: an untrained model is near log(17) = 2.83
    assert 2.0 < first < 4.0, first
    assert last < 0.6 * first, (first, last)
    metrics = json.loads((trained["dir"] / "metrics.json").read_text())
    assert metrics["step"] == 200 and math.isclose(metrics["loss"], losses[-1], rel_tol=1e-3)
    assert_model_dir(trained["dir"])
    assert "1 replicas" in trained["stderr"]


# (f) ---------------------------------------------------------------------------------------------------
def test_perplexity_on_own_training_sentences_far_below_vocab_size(trained, data):
    proc = run_cli(EVALUATE, "--model", trained["dir"], "--test", data["train"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    n_targets = sum(len(line.split()) + 1 for line in data["lines"])  # words + </S> (forward) / <S> (backward)
    assert result["tokens"] == n_targets
    for key in ("forward", "backward", "average"):
        assert 1.0 < result[key] < data["vocab_size"] / 5, result
    # average = exp of the mean of the two mean NLLs = geometric mean of the two perplexities
    assert math.isclose(result["average"], math.sqrt(result["forward"] * result["backward"]), rel_tol=1e-6)


def test_perplexity_of_an_untrained_model_is_near_vocab_size(data):
    """The control for the test above: an untrained model (near-uniform softmax) scores about |V|."""
    model = BiLMPretrainer(BiLMConfig.from_options(TINY_OPTIONS), data["vocab_size"], dropout=0.0)
    result = evaluate_perplexity(model, data["words"], [str(data["train"])])
    assert data["vocab_size"] / 2 < result["average"] < 2 * data["vocab_size"], result


# (b) ---------------------------------------------------------------------------------------------------
@pytest.mark.slow  # CI time: over 20 min on this machine with it (`make test-slow` runs it)
def test_two_replicas_train_and_write_outputs(data, tmp_path):
    out = tmp_path / "run"
    proc = run_pretrain(
        data, out, "--cpu-replicas", 2, "--steps", 60, "--log-every", 1, "--checkpoint-every", 30, *FAST
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 replicas" in proc.stderr
    assert json.loads((out / "train_config.json").read_text())["replicas"] == 2
    assert_model_dir(out)
    _, rows = read_log(out)
    losses = np.array([loss for _, loss in rows])
    assert len(losses) == 60 and np.isfinite(losses).all()
    assert losses[-10:].mean() < losses[:10].mean() - 0.1, losses
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index")) == ["ckpt-30.index", "ckpt-60.index"]


# (c) ---------------------------------------------------------------------------------------------------
def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow  # CI time: over 20 min on this machine with it (`make test-slow` runs it)
def test_two_workers_train_in_step(data, tmp_path):
    out = tmp_path / "run"
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs, logs = [], []
    args = ["--strategy", "multi_worker", "--steps", 20, "--log-every", 5, "--checkpoint-every", 10, *FAST]
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        log = open(tmp_path / f"worker{index}.log", "w+")
        logs.append(log)
        procs.append(
            forked.Popen(
                pretrain_command(data, out, *args),
                cwd=REPO_ROOT,
                env=subprocess_env(TF_CONFIG=tf_config),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        )
    deadline = time.monotonic() + TIMEOUT
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail("a worker hung (collective never completed)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = []
    for log in logs:
        log.seek(0)
        stderr.append(log.read())
        log.close()
    assert [p.returncode for p in procs] == [0, 0], [s[-2000:] for s in stderr]
    assert all("2 replicas" in s for s in stderr)
    assert done_line(stderr[0]) == done_line(stderr[1])  # the all-reduced loss, identical on both workers
    assert done_line(stderr[0]).startswith("done: step 20,")
    assert_model_dir(out)  # the chief (worker 0) writes the outputs
    assert [s for s, _ in read_log(out)[1]] == [5, 10, 15, 20]  # one log, not one per worker
    # the non-chief keeps its own checkpoints, so a rerun resumes every worker from the same step
    assert [p.name for p in out.glob(".worker_*")] == [".worker_1_checkpoints"]


# (d) ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_kill_9_then_same_command_resumes(data, tmp_path):
    """kill -9 at step 13 (after ckpt-10; SIGKILL raised at the end of the step: mid-run on any machine), then the
    same command resumes from ckpt-10, finishes, and log.csv continues."""
    out = tmp_path / "run"
    total = 30
    command = pretrain_command(data, out, "--steps", total, "--log-every", 5, "--checkpoint-every", 10, *FAST)
    first = run_command(signalled_at_step(command, 13, "SIGKILL"))
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert not (out / "weights.hdf5").exists()  # it really died mid-run
    _, rows_before = read_log(out)
    assert [s for s, _ in rows_before] == [5, 10]  # the rows up to the kill are on disk

    second = run_command(command)
    assert second.returncode == 0, second.stderr[-3000:]
    match = re.search(r"resumed from (\S+) at step (\d+)", second.stderr)
    assert match, second.stderr[-3000:]
    resumed_at = int(match.group(2))
    assert resumed_at == 10 and match.group(1).endswith(f"ckpt-{resumed_at}")
    assert f"{total} steps (from step {resumed_at})" in second.stderr
    assert done_line(second.stderr).startswith(f"done: step {total},")
    assert json.loads((out / "metrics.json").read_text())["step"] == total
    assert_model_dir(out)
    # log.csv continues: one header, the first run's rows, then the rerun's from the checkpoint to the end
    header, rows = read_log(out)
    with open(out / "log.csv") as f:
        assert f.read().count("step,loss") == 1
    steps = [s for s, _ in rows]
    assert steps[: len(rows_before)] == [s for s, _ in rows_before]
    assert steps[len(rows_before) :] == list(range(resumed_at + 5, total + 1, 5))


def temporaries(out):
    """Leftovers of interrupted writes under `out`: elmo_tf.io.atomic's `.<name>.tmp-<pid>-<hex>` and the
    `_temp` directories of TensorFlow's checkpoint writer."""
    return [p for p in Path(out).rglob("*") if ".tmp-" in p.name or p.name.endswith("_temp")]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(data, tmp_path):
    """SIGTERM at step 5 (raised at the end of the step: mid-run on any machine): exit 143, a checkpoint of the
    stopped step, no temporary; the same command resumes from it and finishes."""
    out = tmp_path / "run"
    total = 20
    args = pretrain_command(data, out, "--steps", total, "--log-every", 1, "--checkpoint-every", 1000, *FAST)
    proc = run_command(signalled_at_step(args, 5, "SIGTERM"))
    first = proc.stderr
    assert proc.returncode == 143, first[-3000:]
    assert "Traceback" not in first, first[-3000:]
    saved = re.search(r"saved (\S+ckpt-(\d+)) \(interrupted\): a rerun resumes from it", first)
    assert saved, first[-3000:]
    stopped_at = int(saved.group(2))
    assert stopped_at == 5
    assert tf.train.latest_checkpoint(str(out / "checkpoints")) == saved.group(1)
    assert not (out / "weights.hdf5").exists()  # stopped, not finished
    assert temporaries(out) == []
    _, rows_before = read_log(out)
    assert rows_before and rows_before[-1][0] in (stopped_at - 1, stopped_at)  # the stopped step's row may be lost

    second = run_command(args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {saved.group(1)} at step {stopped_at}" in second.stderr
    assert f"{total} steps (from step {stopped_at})" in second.stderr
    assert json.loads((out / "metrics.json").read_text())["step"] == total
    assert_model_dir(out)
    assert temporaries(out) == []
    steps = [s for s, _ in read_log(out)[1]]
    assert steps[len(rows_before) :] == list(range(stopped_at + 1, total + 1))


@pytest.mark.slow
def test_max_minutes_stops_and_writes_the_model_dir(data, tmp_path):
    out = tmp_path / "run"
    # 0.001 minutes = 60 ms: less than the first step, which includes tracing the train step
    proc = run_pretrain(data, out, "--steps", 100000, "--max-minutes", 0.001, "--log-every", 1000, *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: step 1, " in proc.stderr and "(stopped: 0.001 minutes)" in proc.stderr, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == 1 and metrics["stop_reason"] == "stop_training"
    assert metrics["elapsed_minutes"] >= 0.001
    assert_model_dir(out)
    assert [s for s, _ in read_log(out)[1]] == [1]  # the window the stop cut short is logged
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-1")


# (e) ---------------------------------------------------------------------------------------------------
def test_exported_weights_give_the_in_memory_activations(resumable, data):
    """The model dir `run_pretraining` wrote (the in-process run `resumable`, 4 steps) against its trainer's model."""
    config = BiLMConfig.from_options(TINY_OPTIONS)
    out, trainer, result = resumable["dir"], resumable["run"].trainer, resumable["result"]
    assert result["step"] == 4 and math.isfinite(result["loss"])

    sentences = [data["lines"][0].split(), data["lines"][1].split()[:3], ["unseen", "wörds", "."]]
    n = max(len(s) for s in sentences) + 2  # extra padding
    char_ids = np.zeros([len(sentences), n, 50], np.int32)
    for k, s in enumerate(sentences):
        char_ids[k, : len(s)] = tokens_to_char_ids_numpy(s)
    mask = (char_ids > 0).any(-1)

    loaded = load_elmo(str(out / "options.json"), str(out / "weights.hdf5"))
    from_disk = loaded(char_ids)
    # the same biLM, its weights copied from the trainer's model in memory
    copied = ELMo(config)
    for (name, src, _, _), (name2, dst, _, _) in zip(weight_map(trainer.model), weight_map(copied)):
        assert name == name2
        for s, d in zip(src, dst):
            d.assign(s.numpy())
    in_memory = copied(char_ids)
    assert len(from_disk["activations"]) == 3
    for a, b in zip(from_disk["activations"], in_memory["activations"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
        assert np.abs(a.numpy()).max() > 1e-2  # not a vacuous comparison of zeros

    # and the trainer's own forward pass (no dropout at inference): top layer, forward and backward halves
    p = config.projection_dim
    own = trainer.model({"char_ids": char_ids, "token_ids": np.zeros(char_ids.shape[:2], np.int32)}, training=False)
    top = from_disk["activations"][-1].numpy()
    np.testing.assert_allclose(top[..., :p][mask], own["forward"].numpy()[:, 1:][mask], rtol=0, atol=1e-6)
    np.testing.assert_allclose(top[..., p:][mask], own["backward"].numpy()[:, :-1][mask], rtol=0, atol=1e-6)
    # the model files were trained: they differ from a fresh initialization
    fresh = ELMo(config)
    fresh_top = fresh(char_ids)["activations"][-1].numpy()
    assert np.abs(fresh_top - top)[mask].max() > 1e-3


# (g) ---------------------------------------------------------------------------------------------------
def copy_run(run_dir, tmp_path):
    """A copy of the run directory `run_dir` at `tmp_path/run` (for a test that resumes it or writes into it)."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def checkpoint_digests(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((out / "checkpoints").iterdir())}


@pytest.mark.slow
def test_nan_loss_exits_3_and_keeps_the_checkpoint(data, tmp_path):
    out = tmp_path / "run"
    common = [
        "--batch-size",
        16,
        "--num-sampled",
        16,
        "--optimizer",
        "sgd",
        "--clip-norm",
        0,
        "--log-every",
        1,
        "--checkpoint-every",
        1000,
    ]
    first = run_pretrain(data, out, "--steps", 1, *common, "--learning-rate", 0.1)
    assert first.returncode == 0, first.stderr[-3000:]
    before = checkpoint_digests(out)
    assert "ckpt-1.index" in before
    weights_before = hashlib.sha256((out / "weights.hdf5").read_bytes()).hexdigest()
    # resumed with SGD at 1e30 (the flag wins over the checkpoint): step 2 has a finite loss (the saved weights)
    # and a huge update; the loss of step 3 is not finite
    second = run_pretrain(data, out, "--steps", 20, *common, "--learning-rate", 1e30)
    assert second.returncode == 3, second.stderr[-3000:]
    assert re.search(
        r"loss is (nan|-?inf) at step 3; stopped without saving: the last good checkpoint \(\S*ckpt-1\) "
        r"is kept",
        second.stderr,
    ), second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert checkpoint_digests(out) == before
    assert hashlib.sha256((out / "weights.hdf5").read_bytes()).hexdigest() == weights_before
    assert [s for s, _ in read_log(out)[1]] == [1, 2]


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_checkpoint_and_ends_with_one_line(trained, data, tmp_path):
    """A checkpoint the disk refuses (a file-size limit below its 0.5 MB: EFBIG in TensorFlow's SaveV2, as a full disk
    gives ENOSPC): exit 1 with one line naming it, nothing of it left (no ckpt-202_temp/, no partial shard, no state
    file temporary), the previous checkpoints, state file, weights and log as they were. The run resumed is a copy of
    `trained` (200 steps, checkpoints 100 and 200)."""
    out = copy_run(trained["dir"], tmp_path)
    common = ["--checkpoint-every", 2, "--log-every", 1, *FAST]
    before = checkpoint_digests(out)
    assert sorted(before) == [
        "checkpoint",
        *(f"ckpt-{n}.{e}" for n in (100, 200) for e in ("data-00000-of-00001", "index")),
    ]
    weights = hashlib.sha256((out / "weights.hdf5").read_bytes()).hexdigest()
    log = (out / "log.csv").read_bytes()
    assert (out / "checkpoints" / "ckpt-200.data-00000-of-00001").stat().st_size > 300_000
    second = run_command(pretrain_command(data, out, "--steps", 202, *common), preexec_fn=limit_file_size(300_000))
    ckpt = out / "checkpoints" / "ckpt-202"
    assert_ends_with_one_error(second, 1, "--output", f"cannot write {str(ckpt)!r}", "File too large")
    assert checkpoint_digests(out) == before
    assert hashlib.sha256((out / "weights.hdf5").read_bytes()).hexdigest() == weights
    assert temporaries(out) == [] and not [p for p in (out / "checkpoints").iterdir() if "tmp" in p.name]
    assert tf.train.latest_checkpoint(str(out / "checkpoints")) == str(out / "checkpoints" / "ckpt-200")
    # the log of the steps trained before the refused checkpoint is appended, its rows before kept
    assert (out / "log.csv").read_bytes().startswith(log)
    third = run_pretrain(data, out, "--steps", 202, *common)  # room again: resumes from ckpt-200
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'ckpt-200'} at step 200" in third.stderr


@pytest.mark.slow
def test_diverged_weights_are_never_checkpointed(data, tmp_path):
    """SGD at 1e30 from the start: the weights after step 1 are finite but give a NaN loss; not saved."""
    out = tmp_path / "run"
    proc = run_pretrain(
        data,
        out,
        "--steps",
        5,
        "--batch-size",
        16,
        "--num-sampled",
        16,
        "--optimizer",
        "sgd",
        "--learning-rate",
        1e30,
        "--clip-norm",
        0,
        "--checkpoint-every",
        1,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert re.search(r"(weights after step 1 give a non-finite loss|loss is (nan|-?inf) at step 2)", proc.stderr)
    assert not list((out / "checkpoints").glob("ckpt-*.index"))  # (an absent directory globs to nothing)


class _Run:
    """A Trainer on the tiny model (one device) with the Checkpoints of `out`, restored as a rerun would be."""

    def __init__(self, data, out, **train):
        config = dict(batch_size=8, num_sampled=16, optimizer="sgd", learning_rate=0.5, checkpoint_every=1000, steps=4)
        config.update(train)
        self.trainer = Trainer(
            tf.distribute.OneDeviceStrategy("/cpu:0"),
            BiLMConfig.from_options(TINY_OPTIONS),
            TrainConfig(**config),
            data["words"],
            [str(data["train"])],
        )
        self.checkpoints = Checkpoints(self.trainer, out)
        self.resumed = self.checkpoints.restore()

    def train(self):
        return run_pretraining(self.trainer, self.checkpoints, self.trainer.config.steps, progress=False)


@pytest.fixture(scope="module")
def resumable(data, tmp_path_factory):
    """One in-process run of `_Run` (4 steps of SGD at 0.5, checkpoints at steps 2 and 4), trained once: the resume
    tests take a copy of its directory (`copy_run`), the export test reads its files and its trainer's model.
    Seeded as a test is (tests/conftest.py), whichever test builds it."""
    keras.utils.set_random_seed(1234)
    out = tmp_path_factory.mktemp("resumable") / "run"
    run = _Run(data, out, steps=4, checkpoint_every=2)
    result = run.train()
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index")) == ["ckpt-2.index", "ckpt-4.index"]
    return {"dir": out, "run": run, "result": result}


def test_learning_rate_flag_applies_on_resume(resumable, data, tmp_path):
    out = copy_run(resumable["dir"], tmp_path)  # trained at learning rate 0.5
    resumed = _Run(data, out, learning_rate=1e30, clip_norm=0.0, steps=8)
    assert resumed.resumed
    assert float(resumed.trainer.optimizer.learning_rate.numpy()) == pytest.approx(1e30)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"bucket_width": 2}, "bucket_width 10 -> 2"),
        ({"seed": 3}, "seed 0 -> 3"),
        ({"batch_size": 4}, "batch_size 8 -> 4"),
    ],
)
def test_resuming_with_another_data_order_is_refused(resumable, data, tmp_path, change, named):
    """A resumed run skips the batches already trained; under other data-order settings those are other batches, so
    the rerun is refused, naming the setting and both values, before any state is restored or file written."""
    out = copy_run(resumable["dir"], tmp_path)
    before = checkpoint_digests(out)
    with pytest.raises(CheckpointMismatchError, match=re.escape(named) + r".*rerun with those or use a new output"):
        _Run(data, out, steps=8, **change)
    assert checkpoint_digests(out) == before
    # the run's own settings, with other steps, learning rate and dropout, still resume
    assert _Run(data, out, steps=8, learning_rate=0.1, dropout=0.2).resumed


def test_resuming_on_another_replica_count_is_refused(resumable, data, tmp_path):
    """Each replica's batches are bucketed apart, so the replica count is part of the data order too."""
    out = copy_run(resumable["dir"], tmp_path)
    config = json.loads((out / "train_config.json").read_text())
    assert config["replicas"] == 1
    config["replicas"] = 2  # as a run on 2 replicas records it
    (out / "train_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match=r"replicas 2 -> 1"):
        _Run(data, out, steps=8)


def test_an_unreadable_train_config_does_not_block_resuming(resumable, data, tmp_path, caplog):
    out = copy_run(resumable["dir"], tmp_path)
    (out / "train_config.json").write_bytes(b"\xff\xfe not json")
    with caplog.at_level("WARNING", logger="elmo_tf.pretraining"):
        assert _Run(data, out, steps=8, bucket_width=2).resumed
    assert "train_config.json unreadable" in caplog.text and "not checked" in caplog.text


def test_resume_on_other_training_files_warns(resumable, data, tmp_path, caplog):
    out = copy_run(resumable["dir"], tmp_path)
    config = json.loads((out / "train_config.json").read_text())
    config["train_files"] = ["a.txt", "b.txt"]
    (out / "train_config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="elmo_tf.pretraining"):
        assert _Run(data, out, steps=8).resumed
    assert "training files differ from the run's (1 files, was 2" in caplog.text


def test_nan_after_a_good_checkpoint_keeps_it(resumable, data, tmp_path):
    """In-process: a run from a good checkpoint diverges; NonFiniteLossError, checkpoint files untouched."""
    out = copy_run(resumable["dir"], tmp_path)
    before = checkpoint_digests(out)
    assert {"ckpt-2.index", "ckpt-4.index"} <= set(before)
    resumed = _Run(data, out, learning_rate=1e30, clip_norm=0.0, steps=20, checkpoint_every=1000)
    with pytest.raises(NonFiniteLossError, match=r"loss is (nan|-?inf) at step (5|6|7).*ckpt-4\) is kept"):
        resumed.train()
    assert checkpoint_digests(out) == before


@pytest.mark.slow
def test_last_good_checkpoint_is_really_good(data, tmp_path):
    run = _Run(data, tmp_path / "run", learning_rate=1e30, clip_norm=0.0, steps=20, checkpoint_every=1)
    with pytest.raises(NonFiniteLossError):
        run.train()
    kept = _Run(data, tmp_path / "run").trainer  # restores the checkpoint the message calls good
    batch = next(iter(kept.distributed_dataset(0)))
    fwd, bwd, count = kept.model.losses_sum(batch, training=False, sampled=False)
    assert math.isfinite(float(fwd + bwd)) and float(fwd + bwd) / float(count) < 3 * math.log(
        data["vocab_size"]
    )  # two directions, near uniform


# (h) ---------------------------------------------------------------------------------------------------
def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.skipif(not (ALLENNLP / "lm_weights.hdf5").is_file(), reason=f"no reference weights in {ALLENNLP}")
@pytest.mark.slow
def test_init_from_released_weights(data, tmp_path):
    out = tmp_path / "run"
    options, weights = ALLENNLP / "options.json", ALLENNLP / "lm_weights.hdf5"
    proc = run_pretrain(
        data,
        out,
        "--init-from",
        options,
        weights,
        "--steps",
        1,
        "--batch-size",
        8,
        "--num-sampled",
        16,
        "--optimizer",
        "sgd",
        "--learning-rate",
        1e-6,
        config=options,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"initialized the biLM from \S*lm_weights.hdf5; the softmax starts fresh", proc.stderr)
    initial, written = _datasets(weights), _datasets(out / "weights.hdf5")
    assert set(written) == set(initial)
    for name, value in initial.items():
        np.testing.assert_allclose(written[name], value, rtol=0, atol=1e-5, err_msg=name)
    # the softmax is new: sized to this vocabulary, zero biases moved by at most one tiny step
    softmax = _datasets(out / "softmax.hdf5")
    assert softmax["softmax/W"].shape == (data["vocab_size"], 16)
    assert np.abs(softmax["softmax/b"]).max() < 1e-4


@pytest.mark.slow
def test_init_from_a_run_dir_takes_its_softmax_too(trained, data, tmp_path):
    out = tmp_path / "run"
    src = trained["dir"]
    proc = run_pretrain(
        data,
        out,
        "--init-from",
        src / "options.json",
        src / "weights.hdf5",
        "--steps",
        1,
        "--batch-size",
        8,
        "--num-sampled",
        16,
        "--optimizer",
        "sgd",
        "--learning-rate",
        1e-6,
        config=src / "options.json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initialized biLM and softmax from" in proc.stderr
    for name in ("weights.hdf5", "softmax.hdf5"):
        initial, written = _datasets(src / name), _datasets(out / name)
        for key, value in initial.items():
            np.testing.assert_allclose(written[key], value, rtol=0, atol=1e-5, err_msg=f"{name}:{key}")


def test_init_from_a_different_architecture_is_refused(data, tmp_path):
    if not (ALLENNLP / "lm_weights.hdf5").is_file():
        pytest.skip(f"no reference weights in {ALLENNLP}")
    proc = run_pretrain(
        data, tmp_path / "run", "--init-from", ALLENNLP / "options.json", ALLENNLP / "lm_weights.hdf5", "--steps", 1
    )
    assert proc.returncode != 0
    assert "different architecture" in proc.stderr


# (i) ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag, replace, message",
    [
        ("--train", "{dir}/nothing-*.txt", "no files match"),
        ("--config", "huge", "unknown config 'huge'"),
        ("--vocab", "{dir}/missing-vocab.txt", "cannot read vocabulary"),
        ("--strategy", "multi_worker", "TF_CONFIG"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(data, tmp_path, flag, replace, message):
    args = {
        "--train": str(data["train"]),
        "--vocab": str(data["vocab"]),
        "--config": str(data["options"]),
        "--output": str(tmp_path / "run"),
    }
    args[flag] = replace.format(dir=tmp_path)
    argv = [x for pair in args.items() for x in pair] + ["--steps", "1"]
    proc = run_cli(PRETRAIN, *argv, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: {flag}" in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "1", "--max-minutes", "0"], "--max-minutes must be > 0, got '0'"),
        (["--steps", "1", "--dropout", "1.5"], "--dropout must be < 1, got '1.5'"),
        (["--steps", "1", "--bucket-width", "0"], "--bucket-width must be >= 1, got '0'"),
        (["--steps", "1", "--matmul-precision", "fp16"], "--matmul-precision: invalid choice: 'fp16'"),
        (["--steps", "1", "--precision", "fp16"], "--precision: invalid choice: 'fp16'"),
        (
            ["--steps", "1", "--precision", "bfloat16", "--matmul-precision", "float32"],
            "--matmul-precision: not allowed with argument --precision",
        ),
    ],
)
def test_bad_numbers_exit_2_naming_the_flag(data, tmp_path, extra, message):
    """(The ranges of every flag: tests/cli/test_number_flags.py.)"""
    proc = run_pretrain(data, tmp_path / "run", *extra, timeout=120)
    assert_one_error(proc, 2, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], "float32"),
        (["--precision", "bfloat16"], "bfloat16"),
        (["--matmul-precision", "bfloat16"], "bfloat16"),  # the older name, kept
        (["--precision", "auto"], "native"),
    ],
)
def test_precision_sets_the_training_step_s_matmul_precision(data, tmp_path, caplog, flags, expected):
    """--precision (or its older name --matmul-precision) is `TrainConfig.matmul_precision` (recorded in
    train_config.json); auto is bfloat16 where the CPU multiplies it natively (AVX512_BF16), float32 on this AVX2 CPU,
    and its decision is logged."""
    import logging

    from elmo_tf.cli.pretrain import _configs, build_parser
    from elmo_tf.precision import native_bfloat16

    args = build_parser().parse_args(
        ["--train", str(data["train"]), "--vocab", str(data["vocab"]), "--config", str(data["options"])]
        + ["--output", str(tmp_path / "run"), "--steps", "1", *flags]
    )
    if expected == "native":
        expected = "bfloat16" if native_bfloat16() else "float32"
    with caplog.at_level(logging.INFO, logger="elmo_tf.precision"):
        _, _, train_config = _configs(args)
    assert train_config.matmul_precision == expected
    if "auto" in flags and caplog.records:  # logged once per process: by the first test that asked for auto
        assert f"precision auto: {expected} (this CPU" in caplog.text


def test_a_corpus_of_blank_lines_is_one_data_error_naming_the_file(data, tmp_path):
    """The probe batch of the checkpoints used to end in a StopIteration traceback; now: exit 1 before any model is
    built, naming --train and the file (and every file of a glob whose files are all blank)."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n" * 20)
    proc = run_cli(PRETRAIN, "--train", blank, "--vocab", data["vocab"], "--config", data["options"],
                   "--output", tmp_path / "run", "--steps", 1, *FAST, timeout=120)  # fmt: skip
    assert_one_error(proc, 1, "--train: no tokens in", repr(str(blank)), "every line is blank")
    assert not (tmp_path / "run").exists()
    (tmp_path / "blank2.txt").write_text("\n")
    proc = run_cli(PRETRAIN, "--train", tmp_path / "blank*.txt", "--vocab", data["vocab"], "--config", data["options"],
                   "--output", tmp_path / "run", "--steps", 1, *FAST, timeout=120)  # fmt: skip
    assert_one_error(proc, 1, "--train: no tokens in any of the 2 files", "blank2.txt")


@pytest.mark.parametrize(
    "flag, content, status, needles",
    [
        ("--valid", "\n \n", 1, ["--valid:", "no tokens (all 2 lines are blank)"]),
        ("--valid", "", 1, ["--valid:", "the file is empty"]),
        ("--train", "\ufeffthe cat\n".encode("utf-16"), 1, ["--train:", "UTF-16"]),
        ("--cpu-replicas", "8", 2, ["--cpu-replicas: 8 replicas for --batch-size 4"]),
    ],
    ids=["blank-valid", "empty-valid", "utf16-train", "replicas-over-batch"],
)
def test_data_that_cannot_be_used_stops_before_training(data, tmp_path, flag, content, status, needles):
    """A blank --valid file used to fail after all the training (no model dir written); a UTF-16 corpus trained on
    its bytes; more CPU replicas than sentences per batch built the devices first."""
    path = tmp_path / "file.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    train = path if flag == "--train" else data["train"]
    argv = ["--train", train, "--vocab", data["vocab"], "--config", data["options"],
            "--output", tmp_path / "run", "--steps", 1, *FAST, "--batch-size", 4]  # fmt: skip
    argv += [flag, content] if flag == "--cpu-replicas" else [flag, path] if flag == "--valid" else []
    assert_one_error(run_cli(PRETRAIN, *argv, timeout=120), status, *needles)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_init_from_a_converted_elmoformanylangs_model_with_its_word_column(data, tmp_path):
    """pretrain.py --config/--init-from an `elmo-tf convert --from elmoformanylangs` dir (char vocabulary + word
    embedding): one step and a validation pass on its own char mapping, exit 0; the model dir it writes carries the
    vocabularies and loads, with the initial weights moved by at most one tiny step."""
    from convert_testlib import converted_efml

    src = converted_efml(tmp_path / "converted", "word")
    out = tmp_path / "run"
    proc = run_pretrain(
        data,
        out,
        *("--init-from", src / "options.json", src / "weights.hdf5", "--steps", 1, "--batch-size", 8),
        *("--num-sampled", 16, "--optimizer", "sgd", "--learning-rate", 1e-6, "--valid", data["train"]),
        config=src / "options.json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"initialized the biLM from \S*weights.hdf5; the softmax starts fresh", proc.stderr)
    options = json.loads((out / "options.json").read_text())
    assert options["char_cnn"]["word_embedding"]["vocabulary"] == "word_vocab.tsv"
    assert load_elmo(out / "options.json", out / "weights.hdf5").char_cnn.input_width == 51
    initial, written = _datasets(src / "weights.hdf5"), _datasets(out / "weights.hdf5")
    assert set(written) == set(initial)
    for name, value in initial.items():
        np.testing.assert_allclose(written[name], value, rtol=0, atol=1e-5, err_msg=name)
