"""biLM pretraining: one custom training loop for every `tf.distribute` strategy, Keras callbacks around it.

`model.fit` fails under MultiWorkerMirroredStrategy in Keras 3 (keras-team/keras#20585), so a single
custom loop (`distribute_datasets_from_function` + `strategy.run`) serves one device, mirrored replicas
and multiple workers alike. Loss per step = mean over all target tokens of all replicas of
0.5 * (forward + backward) cross-entropy: each replica divides its sum by the all-reduced global count.
Gradients are all-reduced, then clipped by their global norm (Keras would clip per replica, before the
all-reduce), then applied.

The parts, each usable alone:
    Trainer          the model, optimizer, global step and compiled train step under a strategy (no file I/O
                     when it is built); `Trainer.fit` runs steps and calls `keras.callbacks` (see its docstring
                     for how the loop maps onto the hooks).
    Checkpoints      the run directory's `tf.train.CheckpointManager`: `restore` (resume rules), `save` (never
                     a checkpoint whose weights give a non-finite loss).
    callbacks        `CheckpointEvery`, `StopAfterMinutes`, `ProgressBar`, `StepCSVLogger` (Keras' CSVLogger
                     with fixed columns); `keras.callbacks.TensorBoard` is used as it is.
    functions        `count_steps` (epochs -> steps), `load_initial_weights` (--init-from), `run_pretraining`
                     (what training/pretrain.py does between restoring and exiting), `write_model_dir`,
                     `load_model_dir`, `evaluate_perplexity`.

Example:
    trainer = Trainer(strategy, bilm_config, train_config, vocab, ["train.txt"])
    checkpoints = Checkpoints(trainer, "runs/small")
    checkpoints.restore()  # resumes from runs/small/checkpoints when there is a checkpoint
    metrics = run_pretraining(trainer, checkpoints, count_steps(train_config, ["train.txt"]))
"""

import dataclasses
import glob
import json
import logging
import math
import os
import shutil
import time

import h5py
import keras
import tensorflow as tf

from elmo_tf.config import (
    INT32_MAX,
    INT64_MAX,
    SEED_MAX,
    BiLMConfig,
    Bounds,
    ConfigError,
    check_bounds,
    config_field,
)
from elmo_tf.distribute import is_chief
from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.io.atomic import atomic_hdf5, write_error, write_json
from elmo_tf.io.bilm_hdf5 import load_bilm_weights, save_bilm_weights
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.layers.bilm import MATMUL_DTYPES
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.optimizers import FusedAdagrad, FusedAdam
from elmo_tf.preprocessing.lm_dataset import (
    BATCH_SIZE,
    SHUFFLE_BUFFER,
    TOKENS,
    LMDataError,
    lm_dataset,
    vocabulary_table,
)

log = logging.getLogger("elmo_tf.pretrain")
OPTIMIZERS = ("adagrad", "adam", "sgd")
MATMUL_PRECISIONS = tuple(d for d in MATMUL_DTYPES if d)  # what BiLM's training scan takes: float32, bfloat16
# the TrainConfig fields that set which batches a step sees: a resumed run skips the steps already trained, which
# lands on the same data position only when they are the run's own (`Checkpoints.restore` checks them)
DATA_ORDER_FIELDS = ("batch_size", "max_tokens", "shuffle_buffer", "bucket_width", "seed")
# How `Trainer.fit` ended, as `logs["stop_reason"]` of `on_train_end`.
STOP_REASONS = ("steps", "stop_training", "interrupted", "non_finite", "error")


class NonFiniteLossError(ElmoTFError, RuntimeError):
    """The loss became NaN or inf; nothing is saved, so the last good checkpoint is kept."""


class CheckpointMismatchError(ElmoTFError):
    """A checkpoint that cannot be resumed: it does not fit the model or optimizer, or the workers of a
    multi-worker run restored different steps."""


# the types and ranges of TrainConfig's number fields (the same objects check training/pretrain.py's flags)
_SIZE = Bounds(int, 1, INT32_MAX)
_EVERY = Bounds(int, 1, INT64_MAX)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train (the architecture is a `BiLMConfig`). Defaults follow the original recipe where it
    fits a CPU: Adagrad lr 0.2 (initial accumulator 1.0), global-norm clip 10, dropout 0.1.

    Each field knows its training/pretrain.py flag and its range (`elmo_tf.config.config_field`): a bad value raises
    `ConfigError` whose `key` is the field, and `field_flag(TrainConfig, e.key)` is the flag to blame.
    """

    batch_size: int = config_field(128, "--batch-size", BATCH_SIZE)  # sentences per step, all replicas together
    max_tokens: int = config_field(50, "--max-tokens", TOKENS)  # longer lines are cut into pieces of this many tokens
    steps: int = config_field(0, "--steps", Bounds(int, 0, INT64_MAX))  # total steps (0: from epochs)
    epochs: float = config_field(0.0, "--epochs", Bounds(float, 0))
    optimizer: str = config_field("adagrad", "--optimizer")
    learning_rate: float = config_field(0.2, "--learning-rate", Bounds(float, 0, open_low=True))
    clip_norm: float = config_field(10.0, "--clip-norm", Bounds(float, 0))  # global-norm clipping (0: off)
    dropout: float = config_field(0.1, "--dropout", Bounds(float, 0, 1, open_high=True))
    num_sampled: int = config_field(8192, "--num-sampled", _SIZE)
    checkpoint_every: int = config_field(200, "--checkpoint-every", _EVERY)
    log_every: int = config_field(10, "--log-every", _EVERY)
    validate_every: int = config_field(0, "--validate-every", Bounds(int, 0, INT64_MAX))  # 0: only at the end
    shuffle_buffer: int = config_field(10000, "--shuffle-buffer", SHUFFLE_BUFFER)  # 0: no shuffling
    # sentences batched in length buckets this wide (see lm_dataset for the measured trade-off)
    bucket_width: int = config_field(10, "--bucket-width", TOKENS)
    # dtype of the training step's LSTM and sampled-softmax matmuls; "bfloat16" steps faster on CPUs with
    # AVX512_BF16 and on GPUs, with the weights, state and optimizer still float32 (bench/README.md has the
    # measurements); evaluation and exports are float32 either way
    matmul_precision: str = config_field("float32", "--matmul-precision")
    seed: int = config_field(0, "--seed", Bounds(int, 0, SEED_MAX))  # data order (and the CLI's weights)

    def __post_init__(self):
        check_bounds(self)
        if self.steps == 0 and self.epochs == 0:
            raise ConfigError(f"or epochs must be > 0, got steps={self.steps}, epochs={self.epochs}", "steps")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"must be one of {OPTIMIZERS}, got {self.optimizer!r}", "optimizer")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"must be one of {MATMUL_PRECISIONS}, got {self.matmul_precision!r}", "matmul_precision")


def _cpu_has_bfloat16():
    """Whether this CPU multiplies bfloat16 natively (x86 AVX512_BF16 or AMX); True where it cannot be told (not
    Linux), so that no warning is given without evidence."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return True
    return flags is None or bool({"avx512_bf16", "amx_bf16"} & set(flags))


def make_optimizer(config):
    """The Keras optimizer a `TrainConfig` names (Adagrad as in bilm-tf: initial accumulator 1.0). Adagrad and Adam
    are elmo_tf's fused ones (`elmo_tf.optimizers`: one kernel per variable, repeated sparse indices summed)."""
    if config.optimizer == "adagrad":
        return FusedAdagrad(config.learning_rate, initial_accumulator_value=1.0, epsilon=1e-7)
    if config.optimizer == "adam":
        return FusedAdam(config.learning_rate)
    return keras.optimizers.SGD(config.learning_rate)


def count_pieces(files, max_tokens):
    """Training sentences per pass (lines cut into pieces of at most `max_tokens`), streamed."""
    total = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                n = len(line.split())
                total += -(-n // max_tokens)
    return total


def save_softmax(model, path):
    """`softmax/W` `(vocab, P)` and `softmax/b` `(vocab,)` of a `BiLMPretrainer` as hdf5, atomically
    (`elmo_tf.io.atomic`: `path` holds the old file or the whole new one)."""
    with atomic_hdf5(path) as f:
        f.create_dataset("softmax/W", data=model.softmax_kernel.numpy())
        f.create_dataset("softmax/b", data=model.softmax_bias.numpy())


def load_softmax(model, path):
    with h5py.File(path, "r") as f:
        for name, var in (("softmax/W", model.softmax_kernel), ("softmax/b", model.softmax_bias)):
            if name not in f:
                raise ValueError(f"softmax file {path!r} has no dataset {name!r}")
            if f[name].shape != tuple(var.shape):
                raise ValueError(f"dataset {name!r} in {path!r} has shape {f[name].shape}, expected {tuple(var.shape)}")
            var.assign(f[name][...])


def write_model_dir(model, vocab, output_dir):
    """`options.json`, `weights.hdf5` (bilm-tf layout), `vocab.txt`, `softmax.hdf5` into `output_dir` (created).

    Each file is written atomically (`elmo_tf.io.atomic`): an error or SIGTERM while writing leaves the previous
    file as it was and no temporary; a temporary left by `kill -9` is removed by the next write.
    """
    os.makedirs(output_dir, exist_ok=True)
    model.config.to_json(os.path.join(output_dir, "options.json"))
    save_bilm_weights(model, os.path.join(output_dir, "weights.hdf5"))
    save_softmax(model, os.path.join(output_dir, "softmax.hdf5"))
    vocab.save(os.path.join(output_dir, "vocab.txt"))


def load_model_dir(model_dir):
    """The `BiLMPretrainer` and `Vocabulary` written by `write_model_dir` (for evaluation)."""
    for name in ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt"):
        if not os.path.isfile(os.path.join(model_dir, name)):
            raise ValueError(f"model dir {model_dir!r} has no {name}")
    vocab = Vocabulary.load(os.path.join(model_dir, "vocab.txt"))
    model = BiLMPretrainer(BiLMConfig.from_json(os.path.join(model_dir, "options.json")), len(vocab), dropout=0.0)
    load_bilm_weights(model, os.path.join(model_dir, "weights.hdf5"))
    load_softmax(model, os.path.join(model_dir, "softmax.hdf5"))
    return model, vocab


def evaluate_perplexity(model, vocab, files, batch_size=64, max_tokens=50, progress=None):
    """Full-softmax perplexity over `files`: dict with forward, backward, average (exp of the mean of the
    two mean NLLs), tokens (targets counted: words plus `</S>` forward, `<S>` backward)."""
    table = vocabulary_table(vocab.words)
    ds = lm_dataset(files, table, batch_size, max_tokens=max_tokens, shuffle_buffer=0, repeat=False)

    @tf.function(
        input_signature=[
            {"char_ids": tf.TensorSpec([None, None, 50], tf.int32), "token_ids": tf.TensorSpec([None, None], tf.int32)}
        ]
    )
    def step(batch):
        return model.losses_sum(batch, training=False, sampled=False)

    fwd = bwd = count = 0.0
    for batch in ds:
        f, b, n = step(batch)
        fwd, bwd, count = fwd + float(f), bwd + float(b), count + float(n)
        if progress:
            progress(int(batch["token_ids"].shape[0]))
    if count == 0:
        raise ValueError(f"no tokens to evaluate in {files}")
    return {
        "forward": math.exp(fwd / count),
        "backward": math.exp(bwd / count),
        "average": math.exp(0.5 * (fwd + bwd) / count),
        "tokens": int(count),
    }


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def clip_and_average(grads, clip, replicas):
    """`tf.clip_by_global_norm(grads, clip)` divided by `replicas`, in one multiply per gradient, and none when
    there is nothing to do (one replica and a global norm <= `clip`): each multiply is a pass over the gradient's
    memory (98.7M floats at the original shapes).

    Args:
        grads: gradients summed over the replicas (tensors or `tf.IndexedSlices`).
        clip: the global-norm bound (> 0).
        replicas: how many replicas the sum is over.
    Returns:
        the scaled gradients, `g * clip * min(1 / norm, 1 / clip) / replicas` with `norm = tf.linalg.global_norm(grads)`
        (NaN everywhere when the norm is not finite, as `tf.clip_by_global_norm` does).
    """
    norm = tf.linalg.global_norm(grads)
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)  # (norm - norm): NaN when norm is inf/NaN

    def scaled():
        factor = scale / replicas  # one scalar op, not one per gradient
        return [_scale(g, factor) for g in grads]

    return tf.cond(norm <= clip, lambda: list(grads), scaled) if replicas == 1 else scaled()


def _compile_train_step(strategy, model, optimizer, step, clip):
    """The compiled step: `train_step(iterator)` -> `(forward_sum, backward_sum, count)` summed over replicas."""
    replicas = strategy.num_replicas_in_sync

    def replica_step(batch):
        ctx = tf.distribute.get_replica_context()
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            fwd, bwd, count = model.losses_sum(batch, training=True)
            global_count = tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, count), 1.0)
            loss = 0.5 * (fwd + bwd) / global_count
        grads = tape.gradient(loss, variables)
        if clip:
            # clip the global gradient, then let the optimizer's own SUM all-reduce rebuild it exactly
            grads = clip_and_average(ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads), clip, replicas)
        optimizer.apply_gradients(zip(grads, variables))
        return fwd, bwd, count

    @tf.function
    def train_step(iterator):
        fwd, bwd, count = strategy.run(replica_step, args=(next(iterator),))
        total = [strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None) for x in (fwd, bwd, count)]
        step.assign_add(1)
        return total

    return train_step


def _file_list(name, files, allow_none=False):
    """`files` as a list of path strings; a bare string (one path, or a stray positional argument) is refused."""
    if files is None and allow_none:
        return []
    if isinstance(files, (str, bytes, os.PathLike)) or files is None:
        raise ValueError(f"{name} must be a list of file paths, got {files!r}")
    files = [os.fspath(f) for f in files]
    if not files and not allow_none:
        raise ValueError(f"{name} must name at least one file, got {files!r}")
    return files


def _num_workers(strategy):
    return getattr(strategy.extended, "_num_workers", 1)


class Trainer:
    """Trains a `BiLMPretrainer` under a strategy: the model, its optimizer, the global step and the compiled
    train step, built inside `strategy.scope()`. Building it reads and writes no file; the data is read when
    `distributed_dataset` is iterated. Checkpoints, logs and the model directory are the business of
    `Checkpoints`, callbacks and `run_pretraining`.

    Args:
        strategy: a `tf.distribute.Strategy`.
        bilm_config: `BiLMConfig`.
        train_config: `TrainConfig` (`batch_size` is global: it must divide over the replicas).
        vocab: `Vocabulary`.
        train_files: list of text files (one sentence per line).
        valid_files: optional list of text files for perplexity (`validate`).
    Attributes:
        model: the `BiLMPretrainer`; `optimizer`: its Keras optimizer; `step`: int64 `tf.Variable`, steps trained;
        train_seconds: float64 `tf.Variable`, training wall time of the run so far (saved in checkpoints);
        chief: whether this worker writes the run's outputs.
        train_step: `train_step(iterator)` -> `(forward_sum, backward_sum, target_count)` scalar tensors summed
            over the replicas; one optimizer update; `step` + 1.

    Example:
        trainer = Trainer(tf.distribute.MirroredStrategy(), config, TrainConfig(steps=100), vocab, ["a.txt"])
        logs = trainer.fit(100, callbacks=[StepCSVLogger("log.csv"), keras.callbacks.TensorBoard("tb")])
    """

    def __init__(self, strategy, bilm_config, train_config, vocab, train_files, valid_files=None):
        if not isinstance(bilm_config, BiLMConfig):
            raise TypeError(f"bilm_config must be a BiLMConfig, got {type(bilm_config).__name__}")
        if not isinstance(train_config, TrainConfig):
            raise TypeError(f"train_config must be a TrainConfig, got {type(train_config).__name__}")
        self.strategy = strategy
        self.bilm_config = bilm_config
        self.config = train_config
        self.vocab = vocab
        self.train_files = _file_list("train_files", train_files)
        self.valid_files = _file_list("valid_files", valid_files, allow_none=True)
        if train_config.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(
                f"batch_size {train_config.batch_size} must divide evenly over {strategy.num_replicas_in_sync} replicas"
            )
        self.chief = is_chief(strategy)
        with strategy.scope():
            self.model = BiLMPretrainer(
                bilm_config,
                len(vocab),
                bos_id=vocab.bos_id,
                eos_id=vocab.eos_id,
                num_sampled=train_config.num_sampled,
                dropout=train_config.dropout,
                matmul_dtype=None if train_config.matmul_precision == "float32" else train_config.matmul_precision,
            )
            self.optimizer = make_optimizer(train_config)
            self.optimizer.build(self.model.trainable_variables)
            # Keras callbacks read the optimizer from the model (TensorBoard logs its learning rate), as after
            # `compile`; the checkpoint keys stay the same (the optimizer is also a direct child of it)
            self.model.optimizer = self.optimizer
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        if self.model.matmul_dtype and not tf.config.list_logical_devices("GPU") and not _cpu_has_bfloat16():
            log.warning(
                "matmul_precision bfloat16 on a CPU without AVX512_BF16 or AMX: its bfloat16 matmuls are emulated and "
                "may run slower than float32"
            )
        self.train_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_seconds")
        self.train_step = _compile_train_step(strategy, self.model, self.optimizer, self.step, train_config.clip_norm)
        self.probe_loss = tf.function(lambda batch: self.model.losses_sum(batch, training=False, sampled=False))

    def distributed_dataset(self, start_step):
        """The training batches distributed over the replicas (`distribute_datasets_from_function`), shuffled,
        repeated, with the batches of steps `1..start_step` skipped (the data position of a resumed run)."""
        config, table = self.config, vocabulary_table(self.vocab.words)

        def make(ctx):
            per_replica = ctx.get_per_replica_batch_size(config.batch_size)
            ds = lm_dataset(
                self.train_files,
                table,
                per_replica,
                max_tokens=config.max_tokens,
                shuffle_buffer=config.shuffle_buffer,
                bucket_width=config.bucket_width,
                seed=config.seed + ctx.input_pipeline_id,
                num_shards=ctx.num_input_pipelines,
                shard_index=ctx.input_pipeline_id,
            )
            # each step takes one batch per replica of this pipeline: skip what was trained already
            per_step = ctx.num_replicas_in_sync // ctx.num_input_pipelines
            return ds.skip(start_step * per_step)

        return self.strategy.distribute_datasets_from_function(make)

    def first_batch(self, size=8):
        """The first `size` sentences of the training files, unshuffled (the checkpoints' probe batch).

        Raises:
            LMDataError: the training files hold no token (every line blank), naming them.
        """
        ds = lm_dataset(
            self.train_files,
            vocabulary_table(self.vocab.words),
            size,
            max_tokens=self.config.max_tokens,
            shuffle_buffer=0,
            repeat=False,
        )
        batch = next(iter(ds), None)
        if batch is None:
            named = ", ".join(map(repr, self.train_files))
            raise LMDataError(f"no tokens in the training files ({named}): every line is blank", self.train_files)
        return batch

    def validate(self):
        """Full-softmax perplexity on `valid_files` (`evaluate_perplexity`), or None without them."""
        if not self.valid_files:
            return None
        return evaluate_perplexity(self.model, self.vocab, self.valid_files, max_tokens=self.config.max_tokens)

    def _any_worker(self, flag):
        """`flag` or-ed over the workers (one all-reduce; only in a multi-worker run): every worker stops at the
        same step, or the next step's collectives would wait forever for the one that stopped."""
        if _num_workers(self.strategy) <= 1:
            return flag
        value = tf.constant(1.0 if flag else 0.0)
        total = self.strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)
        )
        return float(self.strategy.experimental_local_results(total)[0]) > 0

    def _stop_requested(self):
        stop = self._any_worker(bool(getattr(self.model, "stop_training", False)))
        if stop:
            self.model.stop_training = True
        return stop

    def fit(self, total_steps, callbacks=None, log_every=None, validate_every=None):
        """Trains from the current `step` up to `total_steps`, calling Keras callbacks; returns the last logs.

        How the loop maps onto `keras.callbacks.Callback` hooks (the Keras convention for a custom loop:
        a `keras.callbacks.CallbackList` with `model=self.model`):
            - an "epoch" is a logging window of `log_every` steps (windows end at multiples of `log_every` and
              at `total_steps`); its index is a step number: `on_epoch_begin(epoch)` gets the step the window
              is planned to end at, `on_epoch_end(epoch, logs)` the step it ended at (the same unless training
              stopped inside the window). So `keras.callbacks.CSVLogger` writes one row per window with the
              step in its `epoch` column, and `keras.callbacks.TensorBoard` plots against the step.
            - `on_train_batch_begin(batch)` / `on_train_batch_end(batch, logs)`: one per step, `batch` = the
              step number (1-based, global, not the index inside the window). Batch logs: `step`, `loss` (mean
              cross-entropy per target of the step, both directions averaged, sampled softmax), `tokens`
              (targets of the step), `elapsed_minutes`.
            - epoch logs: `step`, `loss` (mean over the window's targets), `perplexity` (exp of it, capped at
              e^50), `tokens_per_s` (targets per second of the window), `elapsed_minutes` (training wall time
              of the run: `train_seconds`, continued on resume, validation excluded), and `val_perplexity`
              (full-softmax average perplexity on `valid_files`) in the windows where validation ran (the
              window reached a multiple of `validate_every`).
            - `on_train_begin(logs)` with `step` and `elapsed_minutes` of the start; `on_train_end(logs)` is
              called however the loop ends (also on an exception: it runs in a `finally`), with the last epoch
              logs, the final `step` and `stop_reason`, one of `STOP_REASONS`: "steps" (total_steps reached),
              "stop_training" (a callback set `model.stop_training = True`, the Keras convention: the loop
              ends after the step or window where it was set, normally), "interrupted" (KeyboardInterrupt,
              or SystemExit such as SIGTERM through `elmo_tf.cli`), "non_finite" (`NonFiniteLossError`), or
              "error". The exception itself is re-raised after `on_train_end`.
            - callback params: `total_steps`, `initial_step`, `log_every`, `validate_every`, and for Keras'
              own callbacks `verbose` = 1, `epochs` = total_steps (the last epoch index), `steps` = log_every.

        Args:
            total_steps: train until `step` reaches this (int >= 1); nothing runs when it already has.
            callbacks: list of `keras.callbacks.Callback` (or a `CallbackList`).
            log_every: steps per logging window (default `TrainConfig.log_every`).
            validate_every: steps between validations (default `TrainConfig.validate_every`; 0: never here,
                `run_pretraining` validates at the end).
        Returns:
            dict: the last epoch logs (empty when no step ran) with `step` and `stop_reason`.
        Raises:
            NonFiniteLossError: the loss of a step is NaN or inf (nothing more is saved).
        """

        total_steps = check_int("total_steps", total_steps, 1)
        log_every = check_int("log_every", self.config.log_every if log_every is None else log_every, 1)
        validate_every = check_int(
            "validate_every", self.config.validate_every if validate_every is None else validate_every, 0
        )
        start = int(self.step.numpy())
        params = {
            "total_steps": total_steps,
            "initial_step": start,
            "log_every": log_every,
            "validate_every": validate_every,
            "verbose": 1,
            "epochs": total_steps,
            "steps": log_every,
        }
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks.set_model(self.model)
            callbacks.set_params(params)
        else:
            callbacks = keras.callbacks.CallbackList(callbacks, model=self.model, **params)
        iterator = iter(self.distributed_dataset(start))
        self.model.stop_training = False
        base_seconds, began, paused = float(self.train_seconds.numpy()), time.perf_counter(), 0.0

        def elapsed_seconds():
            return base_seconds + time.perf_counter() - began - paused

        step, logs, reason, stop = start, {}, "error", False
        callbacks.on_train_begin({"step": start, "elapsed_minutes": base_seconds / 60})
        try:
            while step < total_steps and not stop:
                window_start = step
                window_end = min(total_steps, (step // log_every + 1) * log_every)
                callbacks.on_epoch_begin(window_end)
                window_loss = window_count = 0.0
                window_began = time.perf_counter()
                while step < window_end:
                    callbacks.on_train_batch_begin(step + 1)
                    fwd, bwd, count = self.train_step(iterator)
                    fwd, bwd, count = float(fwd), float(bwd), float(count)
                    step += 1
                    if not math.isfinite(fwd + bwd):
                        raise NonFiniteLossError(f"loss is {fwd + bwd} at step {step}; stopped without saving")
                    seconds = elapsed_seconds()
                    self.train_seconds.assign(seconds)
                    window_loss += 0.5 * (fwd + bwd)
                    window_count += count
                    batch_logs = {
                        "step": step,
                        "loss": 0.5 * (fwd + bwd) / max(count, 1.0),
                        "tokens": count,
                        "elapsed_minutes": seconds / 60,
                    }
                    callbacks.on_train_batch_end(step, batch_logs)
                    stop = self._stop_requested()
                    if stop:
                        break
                window_seconds = time.perf_counter() - window_began
                loss = window_loss / max(window_count, 1.0)
                logs = {
                    "step": step,
                    "loss": loss,
                    "perplexity": math.exp(min(loss, 50.0)),
                    "tokens_per_s": window_count / max(window_seconds, 1e-9),
                    "elapsed_minutes": seconds / 60,
                }
                if validate_every and step // validate_every > window_start // validate_every:
                    validation_began = time.perf_counter()
                    valid = self.validate()
                    paused += time.perf_counter() - validation_began
                    if valid:
                        logs["val_perplexity"] = valid["average"]
                callbacks.on_epoch_end(step, logs)
                stop = stop or self._stop_requested()
            reason = "steps" if step >= total_steps else "stop_training"
        except NonFiniteLossError:
            reason = "non_finite"
            raise
        except (KeyboardInterrupt, SystemExit):
            reason = "interrupted"
            log.warning("interrupted at step %d", int(self.step.numpy()))
            raise
        finally:
            callbacks.on_train_end(dict(logs, step=int(self.step.numpy()), stop_reason=reason))
        return dict(logs, step=step, stop_reason=reason)


class Checkpoints:
    """The checkpoints of a `Trainer` in `<output_dir>/checkpoints`: model, optimizer, `step` and `train_seconds`
    through a `tf.train.CheckpointManager` that keeps the last `max_to_keep`.

    A non-chief worker of a multi-worker run must save too (the save runs collectives) but somewhere
    disposable that is still its own between runs: `<output_dir>/.worker_<task id>_checkpoints`, so a rerun
    resumes every worker from the same step. Building this object reads the directory's `checkpoint` state
    file (if any) and writes nothing.

    Args:
        trainer: the `Trainer` whose state is saved.
        output_dir: the run directory.
        max_to_keep: checkpoints kept (older ones are deleted).
    """

    def __init__(self, trainer, output_dir, max_to_keep=3):
        self.trainer = trainer
        self.output_dir = os.fspath(output_dir)
        if trainer.chief:
            self.directory = os.path.join(self.output_dir, "checkpoints")
        else:
            task = trainer.strategy.cluster_resolver.task_id
            self.directory = os.path.join(self.output_dir, f".worker_{task}_checkpoints")
        self.checkpoint = tf.train.Checkpoint(
            model=trainer.model, optimizer=trainer.optimizer, step=trainer.step, train_seconds=trainer.train_seconds
        )
        self.max_to_keep = max_to_keep
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=max_to_keep)
        self._probe_batch = None

    @property
    def latest(self):
        """Path prefix of the newest checkpoint, or None."""
        return self.manager.latest_checkpoint

    def probe_batch(self):
        """The batch `save` checks the weights on (the first 8 training sentences), read on the first call."""
        if self._probe_batch is None:
            self._probe_batch = self.trainer.first_batch(8)
        return self._probe_batch

    def restore(self):
        """Restores the newest checkpoint, if any; returns True when it did (a resumed run).

        The learning rate of `TrainConfig` wins over the checkpoint's (the flag of the rerun applies). Checkpoints
        written before `train_seconds` was saved restore with the training time starting at 0. In a multi-worker
        run every worker must call this (it ends with a collective check that all restored the same step).

        The settings that decide the data order (`DATA_ORDER_FIELDS` and the replica count) must be the run's
        own, as its `train_config.json` records them (all workers refuse together): the resumed run skips the
        batches already trained, which are the same batches only under the same settings. Other files than the
        run's are logged as a warning (more data may be meant). Other settings (steps, learning rate, dropout,
        clipping, ...) may change between runs.

        Raises:
            CheckpointMismatchError: the checkpoint does not fit the model or optimizer, the data order differs
                from the run's, or the workers restored different steps.
        """
        path = self.latest
        refusal = self._data_order_refusal(path) if path else None
        # decided together: a worker that raised alone would leave the others waiting in the next collective
        if self.trainer._any_worker(refusal is not None) and refusal is None:
            refusal = f"another worker refused to resume from {path}: its run records another data order (see its log)"
        if refusal:
            raise CheckpointMismatchError(refusal)
        if path:
            saved = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
            checkpoint = self.checkpoint
            if "train_seconds" not in saved:
                trainer = self.trainer
                checkpoint = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer, step=trainer.step)
            try:
                checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError) as e:
                raise CheckpointMismatchError(
                    f"checkpoint {path} does not fit this model and optimizer ({' '.join(str(e).split())[:300]}); "
                    f"resume with the run's own configuration or use a new output directory"
                ) from None
            restored_lr = float(self.trainer.optimizer.learning_rate.numpy())
            wanted_lr = self.trainer.config.learning_rate
            if not math.isclose(restored_lr, wanted_lr, rel_tol=1e-6):  # the variable is float32
                log.info("learning rate %g from the checkpoint replaced by %g", restored_lr, wanted_lr)
            self.trainer.optimizer.learning_rate.assign(wanted_lr)
            log.info("resumed from %s at step %d", path, int(self.trainer.step.numpy()))
        self._check_workers_agree()
        return path is not None

    def _data_order_refusal(self, path):
        """Why resuming from `path` would train on another data order than the run's: this trainer's data-order
        settings or replica count differ from those in the run's `train_config.json`; None when they agree (a
        run without a readable one, e.g. a non-chief worker's, is not checked)."""
        config_path = os.path.join(self.output_dir, "train_config.json")
        try:
            with open(config_path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
            log.warning("%s unreadable (%s); the data order of the resumed run is not checked", config_path, e)
            return None
        run = saved.get("train") if isinstance(saved, dict) else None
        if not isinstance(run, dict):
            log.warning("%s holds no 'train' settings; the data order of the resumed run is not checked", config_path)
            return None
        ours = dataclasses.asdict(self.trainer.config)
        changed = [
            f"{name} {run[name]!r} -> {ours[name]!r}"
            for name in DATA_ORDER_FIELDS
            if run.get(name, ours[name]) != ours[name]
        ]
        replicas = self.trainer.strategy.num_replicas_in_sync
        if isinstance(saved.get("replicas"), int) and saved["replicas"] != replicas:
            changed.append(f"replicas {saved['replicas']} -> {replicas}")  # each replica's batches are bucketed apart
        files = saved.get("train_files")
        if isinstance(files, list) and [os.path.basename(str(f)) for f in files] != [
            os.path.basename(f) for f in self.trainer.train_files
        ]:  # a warning: more data on resume may be meant; paths are compared by name (relative globs, another cwd)
            log.warning(
                "the training files differ from the run's (%d files, was %d, %s): the resumed run does not continue "
                "at the same data position",
                len(self.trainer.train_files),
                len(files),
                config_path,
            )
        if not changed:
            return None
        return (
            f"checkpoint {path} was trained with another data order ({'; '.join(changed)}, from {config_path}): "
            "a resumed run skips the batches already trained, which are the same batches only with the run's own "
            "batch size, max tokens, shuffle buffer, bucket width, seed and replica count; rerun with those or use "
            "a new output directory"
        )

    def _check_workers_agree(self):
        """All workers must resume from the same step, or their collectives pair up out of step."""
        strategy = self.trainer.strategy
        if _num_workers(strategy) <= 1:
            return
        step = tf.cast(self.trainer.step, tf.float64)
        moments = strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, tf.stack([step, step * step])
            )
        )
        mean, mean_square = [float(v) for v in strategy.experimental_local_results(moments)[0]]
        if mean_square - mean * mean > 1e-6:  # a non-zero variance: not every worker is at the same step
            raise CheckpointMismatchError(
                f"workers restored different steps (this one {int(self.trainer.step.numpy())}, mean {mean:g}): "
                f"every worker must keep its checkpoint directory under {self.output_dir!r} between runs"
            )

    def save(self):
        """Saves the current state as `ckpt-<step>` and returns its path, unless its weights give a non-finite
        loss on the probe batch: then `NonFiniteLossError` and nothing is written (divergence shows in the
        weights one step before it shows in a training loss).

        Raises:
            elmo_tf.io.atomic.WriteError: the disk refused the checkpoint (full: ENOSPC; a file-size limit: EFBIG,
                which TensorFlow reports as ResourceExhaustedError / OutOfRangeError from SaveV2). What it wrote
                of this checkpoint is removed (`ckpt-<step>_temp/`, partial shards, the state file's temporary);
                the previous checkpoints and the `checkpoint` state file are as they were.
        """
        fwd, bwd, _ = self.trainer.probe_loss(self.probe_batch())
        step = int(self.trainer.step.numpy())
        if not math.isfinite(float(fwd) + float(bwd)):
            raise NonFiniteLossError(f"the weights after step {step} give a non-finite loss; not saved")
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        try:
            return self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            error = write_error(prefix, e)
            if error is None:
                raise
            self._remove_unfinished(prefix)
            raise error from None

    def _remove_unfinished(self, prefix):
        """Removes what a failed save of `prefix` left: its `_temp` directory, TensorFlow's temporaries of the state
        file, and its own files unless the state file on disk already names it (then only the bookkeeping after it
        failed, and the checkpoint is whole)."""
        state = tf.train.get_checkpoint_state(self.directory)
        recorded = state is not None and prefix in {state.model_checkpoint_path, *state.all_model_checkpoint_paths}
        leftovers = [prefix + "_temp"] + glob.glob(glob.escape(self.directory) + "/checkpoint.tmp*")
        if not recorded:
            leftovers += glob.glob(glob.escape(prefix) + ".*")
        for path in leftovers:
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError as e:
                log.warning("cannot remove %s, left by a failed checkpoint: %s", path, e)
        # the manager's own list may hold the checkpoint that failed: read the state file again
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=self.max_to_keep)


class CheckpointEvery(keras.callbacks.Callback):
    """Saves `checkpoints` every `every` steps (`on_train_batch_end`) and when training ends
    (`on_train_end`) after the last step, after `model.stop_training` or on an interrupt (Ctrl-C, SIGTERM
    through `elmo_tf.cli`), so a rerun resumes where this one stopped; never after a non-finite loss or an
    error. A step is saved once; a run that starts from a restored checkpoint and trains no step saves nothing.

    Args:
        checkpoints: a `Checkpoints`.
        every: steps between checkpoints (int >= 1).
    """

    def __init__(self, checkpoints, every):

        super().__init__()
        self.checkpoints = checkpoints
        self.every = check_int("every", every, 1)
        self.saved_step = None

    def _step(self):
        return int(self.checkpoints.trainer.step.numpy())

    def on_train_begin(self, logs=None):
        latest, step = self.checkpoints.latest, self._step()
        self.saved_step = step if latest and latest.endswith(f"ckpt-{step}") else None  # resumed, untrained
        self.checkpoints.probe_batch()  # read now, not in the middle of an interrupt

    def on_train_batch_end(self, batch, logs=None):
        if batch % self.every == 0:
            self._save()

    def on_train_end(self, logs=None):
        reason = (logs or {}).get("stop_reason")
        if reason in ("steps", "stop_training", "interrupted") and self._step() != self.saved_step:
            path = self._save()
            if reason == "interrupted":
                log.warning("saved %s (interrupted): a rerun resumes from it", path)

    def _save(self):
        path = self.checkpoints.save()
        self.saved_step = self._step()
        return path


class StopAfterMinutes(keras.callbacks.Callback):
    """Sets `model.stop_training` once the run's training wall time reaches `minutes` (checked after every
    step on the batch logs' `elapsed_minutes`, which a resumed run continues from its checkpoint: a rerun of
    the same command stops at the same total). `Trainer.fit` then ends normally after that step.

    Args:
        minutes: the budget (> 0).
    """

    def __init__(self, minutes):
        super().__init__()
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
            raise ValueError(f"minutes must be a number > 0, got {minutes!r}")
        self.minutes = float(minutes)
        self.stopped_at = None

    def on_train_batch_end(self, batch, logs=None):
        if self.stopped_at is None and logs["elapsed_minutes"] >= self.minutes:
            self.stopped_at = batch
            self.model.stop_training = True
            log.info("%.4g minutes of training reached at step %d: stopping", self.minutes, batch)


class ProgressBar(keras.callbacks.Callback):
    """A `keras.utils.Progbar` over the run's steps (from `initial_step` to `total_steps` of the params), with
    the loss and perplexity of the last step. `keras.callbacks.ProgbarLogger` does not fit: it restarts at
    every epoch, and an epoch here is a logging window."""

    def on_train_begin(self, logs=None):
        self.bar = keras.utils.Progbar(self.params["total_steps"], stateful_metrics=["loss", "perplexity"])
        self.bar.update(self.params["initial_step"])

    def on_train_batch_end(self, batch, logs=None):
        loss = logs["loss"]
        self.bar.update(batch, [("loss", loss), ("perplexity", math.exp(min(loss, math.log(1e9))))])

    def on_train_end(self, logs=None):
        step = (logs or {}).get("step", self.params["initial_step"])
        if step < self.params["total_steps"]:  # stopped early: end the bar's line
            self.bar.update(step, finalize=True)


class StepCSVLogger(keras.callbacks.CSVLogger):
    """`keras.callbacks.CSVLogger` with its columns fixed up front: `epoch` (the step, see `Trainer.fit`)
    then `columns`, a missing value written as "NA", `step` as an int.

    Keras' CSVLogger takes the sorted keys of the first row it writes and, when none starts with `val_`,
    adds a `val_<key>` column for each; here validation runs in some windows only, and a resumed run appends
    under the header it does not rewrite, so every row must have the same columns whatever its keys.

    Args:
        filename: the CSV file.
        columns: the log keys written, in order.
        append: keep the rows already in the file (a resumed run); False starts it over.
    """

    COLUMNS = ("step", "loss", "perplexity", "tokens_per_s", "elapsed_minutes", "val_perplexity")

    def __init__(self, filename, columns=COLUMNS, append=False):
        super().__init__(filename, append=append)
        self.columns = list(columns)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.keys = list(self.columns)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if "step" in logs:  # `CallbackList` makes every number a float; a step is written as an int
            logs["step"] = int(logs["step"])
        try:
            super().on_epoch_end(epoch, logs)
        except OSError as e:  # a full disk: name the file (a write to an open file's OSError names none)
            raise (write_error(self.filename, e) or e) from None

    def on_train_end(self, logs=None):
        try:
            super().on_train_end(logs)
        except OSError as e:
            raise (write_error(self.filename, e) or e) from None


def count_steps(train_config, train_files):
    """Total steps of a run: `train_config.steps`, or `epochs` passes over `train_files` (read once to count
    their pieces) at `batch_size` sentences per step, at least 1.

    Raises:
        ConfigError (key "epochs"): more steps than an int64 counts.
    """
    if train_config.steps:
        return train_config.steps
    pieces = count_pieces(train_files, train_config.max_tokens)
    steps = train_config.epochs * pieces / train_config.batch_size
    if not steps <= INT64_MAX:  # inf too
        raise ConfigError(f"of {train_config.epochs:g} are {steps:.3g} steps, more than an int64 counts", "epochs")
    total = max(1, math.ceil(steps))
    log.info("%d training sentences per epoch -> %d steps for %.3g epochs", pieces, total, train_config.epochs)
    return total


def load_initial_weights(model, vocab, options_path, weights_path):
    """Starts `model` (a `BiLMPretrainer`) from an existing biLM: the bilm-tf/AllenNLP `weights_path`, and the
    softmax too when a `softmax.hdf5` and a `vocab.txt` with the same words as `vocab` lie beside it (a
    training/pretrain.py output dir); otherwise the softmax keeps its fresh initialization.

    Raises:
        ValueError: `options_path` describes a different architecture than `model.config` (naming the file),
            or a file that does not fit (ConfigError, WeightFileError).
    """
    if BiLMConfig.from_json(options_path) != model.config:
        raise ValueError(
            f"options {options_path!r} describe a different architecture than the run's config; "
            f"pass the same options as the config"
        )
    load_bilm_weights(model, weights_path)
    directory = os.path.dirname(weights_path)
    softmax, vocab_file = os.path.join(directory, "softmax.hdf5"), os.path.join(directory, "vocab.txt")
    if os.path.isfile(softmax) and os.path.isfile(vocab_file) and Vocabulary.load(vocab_file).words == vocab.words:
        load_softmax(model, softmax)
        log.info("initialized biLM and softmax from %s", directory)
    else:
        log.info(
            "initialized the biLM from %s; the softmax starts fresh (no softmax.hdf5 with the same vocabulary "
            "beside it)",
            weights_path,
        )


def write_train_config(trainer, output_dir, total_steps):
    """`train_config.json` (atomically): the `TrainConfig`, the options, total steps, replicas and files."""
    write_json(
        os.path.join(output_dir, "train_config.json"),
        {
            "train": dataclasses.asdict(trainer.config),
            "options": trainer.bilm_config.to_options(),
            "total_steps": total_steps,
            "replicas": trainer.strategy.num_replicas_in_sync,
            "train_files": trainer.train_files,
            "valid_files": trainer.valid_files,
        },
    )


def run_pretraining(trainer, checkpoints, total_steps, callbacks=None, max_minutes=None, progress=True):
    """A run in `checkpoints.output_dir`, as training/pretrain.py does it once the trainer is restored (or
    initialized): `train_config.json`, `Trainer.fit` with the run's callbacks, then validation, the model
    directory (`write_model_dir`) and `metrics.json`. Only the chief writes files other than checkpoints.

    The callbacks, in this order: on the chief `StepCSVLogger` (`log.csv`, appended to when the run resumes
    at a step > 0) and `keras.callbacks.TensorBoard` (`tensorboard/`), `StopAfterMinutes` with `max_minutes`,
    `ProgressBar` with `progress`, then `callbacks`, and last `CheckpointEvery` (`TrainConfig.checkpoint_every`;
    also at the end and on Ctrl-C / SIGTERM).

    Args:
        trainer: a `Trainer`, restored (`checkpoints.restore()`) or fresh.
        checkpoints: the `Checkpoints` of the run directory.
        total_steps: steps of the whole run (see `count_steps`).
        callbacks: more `keras.callbacks.Callback`s (e.g. one that sets `model.stop_training`).
        max_minutes: stop after this much training wall time of the run (None: no limit).
        progress: show a progress bar.
    Returns:
        dict (also `metrics.json`): `loss`, `perplexity`, `tokens_per_s`, `elapsed_minutes` of the last
        window, `step`, `start_step`, `stop_reason`, and `valid` (`evaluate_perplexity`) with valid files.
    Raises:
        NonFiniteLossError: the loss or the weights to save became NaN/inf; the message names the checkpoint
            kept. KeyboardInterrupt / SystemExit: re-raised after the checkpoint is saved.
    """
    output_dir = checkpoints.output_dir
    start = int(trainer.step.numpy())
    log.info(
        "%d replicas, %s parameters, %d steps (from step %d), output %s",
        trainer.strategy.num_replicas_in_sync,
        f"{trainer.model.count_params():,}",
        total_steps,
        start,
        output_dir,
    )
    run_callbacks = []
    if trainer.chief:
        os.makedirs(output_dir, exist_ok=True)
        write_train_config(trainer, output_dir, total_steps)
        run_callbacks.append(StepCSVLogger(os.path.join(output_dir, "log.csv"), append=start > 0))
        run_callbacks.append(keras.callbacks.TensorBoard(os.path.join(output_dir, "tensorboard"), write_graph=False))
    if max_minutes is not None:
        run_callbacks.append(StopAfterMinutes(max_minutes))
    if progress:
        run_callbacks.append(ProgressBar())
    run_callbacks += list(callbacks or [])
    # last: the logs are closed before the final save, which may raise NonFiniteLossError
    run_callbacks.append(CheckpointEvery(checkpoints, trainer.config.checkpoint_every))
    try:
        logs = trainer.fit(total_steps, callbacks=run_callbacks)
    except NonFiniteLossError as e:
        kept = checkpoints.latest or "none: nothing was saved"
        raise NonFiniteLossError(f"{e}: the last good checkpoint ({kept}) is kept") from None
    result = {key: logs.get(key, float("nan")) for key in ("loss", "perplexity", "tokens_per_s", "elapsed_minutes")}
    result.update(step=int(trainer.step.numpy()), start_step=start, stop_reason=logs["stop_reason"])
    valid = trainer.validate()
    if valid:
        result["valid"] = valid
    if trainer.chief:
        write_model_dir(trainer.model, trainer.vocab, output_dir)
        write_json(os.path.join(output_dir, "metrics.json"), result)
    return result


__all__ = [
    "CheckpointEvery",
    "CheckpointMismatchError",
    "Checkpoints",
    "NonFiniteLossError",
    "ProgressBar",
    "StepCSVLogger",
    "StopAfterMinutes",
    "TrainConfig",
    "Trainer",
    "count_steps",
    "evaluate_perplexity",
    "load_initial_weights",
    "load_model_dir",
    "make_optimizer",
    "run_pretraining",
    "write_model_dir",
    "write_train_config",
]
