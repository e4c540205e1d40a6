"""The trainer: a `BiLMPretrainer`, its optimizer, the global step and the compiled train step under a
`tf.distribute` strategy, and the data each step reads. The loop around the step is `elmo_tf.pretraining.loop`."""

import logging
import os

import tensorflow as tf

from elmo_tf import machine
from elmo_tf.config import BiLMConfig
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.preprocessing.lm_dataset import LMDataError, lm_dataset, vocabulary_table
from elmo_tf.pretraining.config import TrainConfig
from elmo_tf.pretraining.distribute import is_chief
from elmo_tf.pretraining.evaluation import evaluate_perplexity
from elmo_tf.pretraining.loop import Controller
from elmo_tf.pretraining.optimizers import make_optimizer
from elmo_tf.pretraining.step import compile_train_step

log = logging.getLogger(__name__)


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
        if self.model.matmul_dtype and not tf.config.list_logical_devices("GPU") and not machine.has_native_bfloat16():
            log.warning(
                "matmul_precision bfloat16 on a CPU without AVX512_BF16 or AMX: its bfloat16 matmuls are emulated "
                "(float32 matmuls, operands and products rounded to bfloat16): the same numbers, no faster than "
                "float32"
            )
        self.train_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_seconds")
        self.train_step = compile_train_step(strategy, self.model, self.optimizer, self.step, train_config.clip_norm)
        self.probe_loss = tf.function(
            lambda batch: self.model.losses_sum(batch, training=False, sampled=False), autograph=False
        )

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
                char_mapping=self.model.char_mapping,
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
            char_mapping=self.model.char_mapping,
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

    def fit(self, total_steps, callbacks=None, log_every=None, validate_every=None):
        """Trains from the current `step` up to `total_steps`, calling Keras callbacks; returns the last logs.

        `Controller(self, total_steps, callbacks, log_every, validate_every).run()`: see
        `elmo_tf.pretraining.loop.Controller` for how the loop maps onto the `keras.callbacks.Callback` hooks,
        its logs and its stop reasons.
        """
        return Controller(self, total_steps, callbacks, log_every, validate_every).run()
