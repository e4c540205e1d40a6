"""biLM pretraining: one custom training loop for every `tf.distribute` strategy.

`model.fit` fails under MultiWorkerMirroredStrategy in Keras 3 (keras-team/keras#20585), so a single
custom loop (`distribute_datasets_from_function` + `strategy.run`) serves one device, mirrored replicas
and multiple workers alike. Loss per step = mean over all target tokens of all replicas of
0.5 * (forward + backward) cross-entropy: each replica divides its sum by the all-reduced global count.
Gradients are all-reduced, then clipped by their global norm (Keras would clip per replica, before the
all-reduce), then applied.
"""

import csv
import dataclasses
import json
import logging
import math
import os
import time

import h5py
import tensorflow as tf

from elmo_tf.config import BiLMConfig
from elmo_tf.distribute import is_chief
from elmo_tf.io.bilm_hdf5 import load_bilm_weights, save_bilm_weights
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table

log = logging.getLogger("elmo_tf.pretrain")
OPTIMIZERS = ("adagrad", "adam", "sgd")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or inf; the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train (the architecture is a `BiLMConfig`). Defaults follow the original recipe where it
    fits a CPU: Adagrad lr 0.2 (initial accumulator 1.0), global-norm clip 10, dropout 0.1."""

    batch_size: int = 128  # sentences per step, all replicas together
    max_tokens: int = 50  # longer lines are cut into pieces of this many tokens
    steps: int = 0  # total steps (0: from epochs)
    epochs: float = 0.0
    optimizer: str = "adagrad"
    learning_rate: float = 0.2
    clip_norm: float = 10.0
    dropout: float = 0.1
    num_sampled: int = 8192
    checkpoint_every: int = 200
    log_every: int = 10
    validate_every: int = 0  # 0: only at the end
    shuffle_buffer: int = 10000
    seed: int = 0

    def __post_init__(self):
        for name in ("batch_size", "max_tokens", "num_sampled", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 0 or self.epochs < 0 or (self.steps == 0 and self.epochs == 0):
            raise ValueError(f"give steps > 0 or epochs > 0, got steps={self.steps}, epochs={self.epochs}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.clip_norm < 0:
            raise ValueError(f"clip_norm must be >= 0, got {self.clip_norm}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def make_optimizer(config):
    import keras

    if config.optimizer == "adagrad":
        return keras.optimizers.Adagrad(config.learning_rate, initial_accumulator_value=1.0, epsilon=1e-7)
    if config.optimizer == "adam":
        return keras.optimizers.Adam(config.learning_rate)
    return keras.optimizers.SGD(config.learning_rate)


def count_pieces(files, max_tokens):
    """Training sentences per pass (lines cut into pieces), streamed."""
    total = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                n = len(line.split())
                total += -(-n // max_tokens)
    return total


def save_softmax(model, path):
    tmp = f"{path}.tmp-{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("softmax/W", data=model.softmax_kernel.numpy())
        f.create_dataset("softmax/b", data=model.softmax_bias.numpy())
    os.replace(tmp, path)


def load_softmax(model, path):
    with h5py.File(path, "r") as f:
        for name, var in (("softmax/W", model.softmax_kernel), ("softmax/b", model.softmax_bias)):
            if name not in f:
                raise ValueError(f"softmax file {path!r} has no dataset {name!r}")
            if f[name].shape != tuple(var.shape):
                raise ValueError(f"dataset {name!r} in {path!r} has shape {f[name].shape}, expected {tuple(var.shape)}")
            var.assign(f[name][...])


def write_model_dir(model, vocab, output_dir):
    """`options.json`, `weights.hdf5` (bilm-tf layout), `vocab.txt`, `softmax.hdf5` into `output_dir`."""
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


class Trainer:
    """Trains a `BiLMPretrainer` under a strategy, with checkpoints, resume, logs and a NaN stop.

    Args:
        strategy: a `tf.distribute.Strategy`.
        bilm_config: `BiLMConfig`.
        train_config: `TrainConfig`.
        vocab: `Vocabulary`.
        train_files: list of text files.
        output_dir: where checkpoints, logs and the final model go.
        valid_files: optional list of text files for perplexity.
        init_from: optional `(options.json, weights.hdf5)` of an existing biLM to start from.
    """

    def __init__(
        self, strategy, bilm_config, train_config, vocab, train_files, output_dir, valid_files=None, init_from=None
    ):
        self.strategy = strategy
        self.bilm_config = bilm_config
        self.config = train_config
        self.vocab = vocab
        self.train_files = list(train_files)
        self.valid_files = list(valid_files or [])
        self.output_dir = output_dir
        self.chief = is_chief(strategy)
        if init_from and BiLMConfig.from_json(init_from[0]) != bilm_config:
            raise ValueError(
                f"--init-from options {init_from[0]!r} describe a different architecture than the "
                f"run's config; pass the same options as --config"
            )
        os.makedirs(output_dir, exist_ok=True)
        with strategy.scope():
            self.model = BiLMPretrainer(
                bilm_config,
                len(vocab),
                bos_id=vocab.bos_id,
                eos_id=vocab.eos_id,
                num_sampled=train_config.num_sampled,
                dropout=train_config.dropout,
            )
            self.optimizer = make_optimizer(train_config)
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.fresh_start = True
        ckpt_dir = os.path.join(output_dir, "checkpoints")
        if not self.chief:  # non-chief workers must save too (collectives), but somewhere disposable
            ckpt_dir = os.path.join(output_dir, f".worker_{strategy.cluster_resolver.task_id}_checkpoints")
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step)
        self.manager = tf.train.CheckpointManager(self.checkpoint, ckpt_dir, max_to_keep=3)
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
            self.fresh_start = False
            restored_lr = float(self.optimizer.learning_rate.numpy())
            if restored_lr != train_config.learning_rate:  # the flag wins over the checkpoint's value
                log.info("learning rate %g from the checkpoint replaced by %g", restored_lr, train_config.learning_rate)
                self.optimizer.learning_rate.assign(train_config.learning_rate)
            log.info("resumed from %s at step %d", self.manager.latest_checkpoint, int(self.step.numpy()))
        elif init_from:
            options, weights = init_from
            load_bilm_weights(self.model, weights)
            softmax = os.path.join(os.path.dirname(weights), "softmax.hdf5")
            vocab_file = os.path.join(os.path.dirname(weights), "vocab.txt")
            if (
                os.path.isfile(softmax)
                and os.path.isfile(vocab_file)
                and Vocabulary.load(vocab_file).words == vocab.words
            ):
                load_softmax(self.model, softmax)
                log.info("initialized biLM and softmax from %s", os.path.dirname(weights))
            else:
                log.info(
                    "initialized the biLM from %s; the softmax starts fresh (no softmax.hdf5 with the "
                    "same vocabulary beside it)",
                    weights,
                )
        if train_config.steps:
            self.total_steps = train_config.steps
        else:
            pieces = count_pieces(self.train_files, train_config.max_tokens)
            self.total_steps = max(1, math.ceil(train_config.epochs * pieces / train_config.batch_size))
            log.info(
                "%d training sentences per epoch -> %d steps for %.3g epochs",
                pieces,
                self.total_steps,
                train_config.epochs,
            )
        self._train_step = self._build_train_step()
        self._check_workers_agree()
        # a fixed probe batch: a checkpoint is written only when the weights give a finite loss on it
        probe = lm_dataset(
            self.train_files,
            vocabulary_table(vocab.words),
            8,
            max_tokens=train_config.max_tokens,
            shuffle_buffer=0,
            repeat=False,
        )
        self._probe_batch = next(iter(probe))
        self._probe_loss = tf.function(lambda batch: self.model.losses_sum(batch, training=False, sampled=False))

    def _check_workers_agree(self):
        """All workers must resume from the same step, or their collectives pair up out of step."""
        if getattr(self.strategy.extended, "_num_workers", 1) <= 1:
            return
        step = tf.cast(self.step, tf.float64)
        moments = self.strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, tf.stack([step, step * step])
            )
        )
        mean, mean_square = [float(v) for v in self.strategy.experimental_local_results(moments)[0]]
        if mean_square - mean * mean > 1e-6:  # a non-zero variance: not every worker is at the same step
            raise ValueError(
                f"workers restored different steps (this one {int(self.step.numpy())}, mean {mean:g}): "
                f"every worker must keep "
                f"its checkpoint directory under {self.output_dir!r} between runs"
            )

    def _dataset(self, start_step):
        config, table = self.config, vocabulary_table(self.vocab.words)

        def make(ctx):
            per_replica = ctx.get_per_replica_batch_size(config.batch_size)
            ds = lm_dataset(
                self.train_files,
                table,
                per_replica,
                max_tokens=config.max_tokens,
                shuffle_buffer=config.shuffle_buffer,
                seed=config.seed + ctx.input_pipeline_id,
                num_shards=ctx.num_input_pipelines,
                shard_index=ctx.input_pipeline_id,
            )
            # each step takes one batch per replica of this pipeline: skip what was trained already
            per_step = ctx.num_replicas_in_sync // ctx.num_input_pipelines
            return ds.skip(start_step * per_step)

        if self.config.batch_size % self.strategy.num_replicas_in_sync:
            raise ValueError(
                f"batch_size {self.config.batch_size} must divide evenly over "
                f"{self.strategy.num_replicas_in_sync} replicas"
            )
        return self.strategy.distribute_datasets_from_function(make)

    def _build_train_step(self):
        model, optimizer, strategy, clip = self.model, self.optimizer, self.strategy, self.config.clip_norm
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
                grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                grads, _ = tf.clip_by_global_norm(grads, clip)
                grads = [_scale(g, 1.0 / replicas) for g in grads]
            optimizer.apply_gradients(zip(grads, variables))
            return fwd, bwd, count

        @tf.function
        def train_step(iterator):
            fwd, bwd, count = strategy.run(replica_step, args=(next(iterator),))
            total = [strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None) for x in (fwd, bwd, count)]
            self.step.assign_add(1)
            return total

        return train_step

    def save_checkpoint(self):
        """Saves the current state, unless its weights give a non-finite loss on the probe batch (then
        `NonFiniteLossError`: divergence shows in the weights one step before it shows in a training loss)."""
        fwd, bwd, _ = self._probe_loss(self._probe_batch)
        if not math.isfinite(float(fwd) + float(bwd)):
            raise NonFiniteLossError(
                f"the weights after step {int(self.step.numpy())} give a non-finite loss; not saved: the last good "
                f"checkpoint ({self.manager.latest_checkpoint}) is kept. Lower --learning-rate or --clip-norm."
            )
        return self.manager.save(checkpoint_number=int(self.step.numpy()))

    def validate(self):
        if not self.valid_files:
            return None
        return evaluate_perplexity(self.model, self.vocab, self.valid_files, max_tokens=self.config.max_tokens)

    def train(self, progress=None):
        """Runs until `total_steps`; returns a dict of final metrics. Raises `NonFiniteLossError`."""
        start_step = int(self.step.numpy())
        if self.chief:
            with open(os.path.join(self.output_dir, "train_config.json"), "w") as f:
                json.dump(
                    {
                        "train": dataclasses.asdict(self.config),
                        "options": self.bilm_config.to_options(),
                        "total_steps": self.total_steps,
                        "replicas": self.strategy.num_replicas_in_sync,
                        "train_files": self.train_files,
                        "valid_files": self.valid_files,
                    },
                    f,
                    indent=2,
                )
        iterator = iter(self._dataset(start_step))
        csv_path = os.path.join(self.output_dir, "log.csv")
        new_csv = not os.path.exists(csv_path)
        csv_file = open(csv_path, "a", newline="") if self.chief else None
        writer = csv.writer(csv_file) if csv_file else None
        if writer and new_csv:
            writer.writerow(["step", "loss", "perplexity", "tokens_per_s", "valid_perplexity"])
        summary = tf.summary.create_file_writer(os.path.join(self.output_dir, "tensorboard")) if self.chief else None
        window = {"loss": 0.0, "count": 0.0, "time": time.perf_counter()}
        last = {"loss": float("nan"), "perplexity": float("nan"), "tokens_per_s": 0.0}
        try:
            for step in range(start_step + 1, self.total_steps + 1):
                fwd, bwd, count = self._train_step(iterator)
                fwd, bwd, count = float(fwd), float(bwd), float(count)
                if not math.isfinite(fwd + bwd):
                    raise NonFiniteLossError(
                        f"loss is {fwd + bwd} at step {step}; stopped without saving: the last good checkpoint "
                        f"({self.manager.latest_checkpoint}) is kept. Lower --learning-rate or --clip-norm."
                    )
                window["loss"] += 0.5 * (fwd + bwd)
                window["count"] += count
                if progress:
                    progress(step, 0.5 * (fwd + bwd) / max(count, 1.0))
                if step % self.config.log_every == 0 or step == self.total_steps:
                    elapsed = time.perf_counter() - window["time"]
                    loss = window["loss"] / max(window["count"], 1.0)
                    last = {
                        "loss": loss,
                        "perplexity": math.exp(min(loss, 50.0)),
                        "tokens_per_s": window["count"] / max(elapsed, 1e-9),
                    }
                    valid = None
                    if self.config.validate_every and step % self.config.validate_every == 0:
                        valid = self.validate()
                    if writer:
                        writer.writerow(
                            [
                                step,
                                f"{loss:.5f}",
                                f"{last['perplexity']:.3f}",
                                f"{last['tokens_per_s']:.1f}",
                                f"{valid['average']:.3f}" if valid else "",
                            ]
                        )
                        csv_file.flush()
                        with summary.as_default():
                            tf.summary.scalar("loss", loss, step=step)
                            tf.summary.scalar("perplexity", last["perplexity"], step=step)
                            tf.summary.scalar("tokens_per_s", last["tokens_per_s"], step=step)
                            if valid:
                                tf.summary.scalar("valid_perplexity", valid["average"], step=step)
                    window = {"loss": 0.0, "count": 0.0, "time": time.perf_counter()}
                if step % self.config.checkpoint_every == 0:
                    self.save_checkpoint()
        except KeyboardInterrupt:
            log.warning("interrupted at step %d: saving a checkpoint", int(self.step.numpy()))
            self.save_checkpoint()
            raise
        finally:
            if csv_file:
                csv_file.close()
        if int(self.step.numpy()) > start_step or self.fresh_start:
            self.save_checkpoint()
        result = dict(last, step=int(self.step.numpy()))
        valid = self.validate()
        if valid:
            result["valid"] = valid
        if self.chief:
            write_model_dir(self.model, self.vocab, self.output_dir)
            with open(os.path.join(self.output_dir, "metrics.json"), "w") as f:
                json.dump(result, f, indent=2)
        return result


__all__ = [
    "NonFiniteLossError",
    "TrainConfig",
    "Trainer",
    "evaluate_perplexity",
    "load_model_dir",
    "make_optimizer",
    "write_model_dir",
]
