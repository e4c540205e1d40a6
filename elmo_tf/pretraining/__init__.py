"""biLM pretraining: one custom training loop for every `tf.distribute` strategy, Keras callbacks around it.

Split as Orbit and Keras split training (a trainer owns the step, a controller owns the loop, one callback per
file), each part usable alone:
    config           `TrainConfig`, the errors (`NonFiniteLossError`, `CheckpointMismatchError`), `STOP_REASONS`.
    step             the compiled train step (`clip_and_average`: the global-norm clip after the all-reduce).
    trainer          `Trainer`: the model, optimizer, global step and compiled step under a strategy, and the data
                     (no file I/O when it is built); `Trainer.fit` runs the loop below.
    loop             `Controller`: steps in logging windows, `keras.callbacks` hooks (its docstring maps the loop
                     onto them), validation, the stop every worker agrees on.
    checkpoints      `Checkpoints`: the run directory's `tf.train.CheckpointManager`: `restore` (resume rules),
                     `save` (never a checkpoint whose weights give a non-finite loss).
    callbacks/       `CheckpointEvery`, `StopAfterMinutes`, `ProgressBar`, `StepCSVLogger` (Keras' CSVLogger with
                     fixed columns); `keras.callbacks.TensorBoard` is used as it is.
    model_dir        `write_model_dir`, `load_model_dir`, `write_train_config`, `load_initial_weights` (--init-from).
    evaluation       `evaluate_perplexity` (full softmax).
    run              `count_steps` (epochs -> steps), `run_pretraining` (what training/pretrain.py does between
                     restoring and exiting).
    optimizers       `FusedAdagrad`, `FusedAdam` (registered Keras classes), `make_optimizer`.
    distribute       `get_strategy` by name, `set_cpu_replicas`, `is_chief`, `any_worker`.

Example:
    trainer = Trainer(strategy, bilm_config, train_config, vocab, ["train.txt"])
    checkpoints = Checkpoints(trainer, "runs/small")
    checkpoints.restore()  # resumes from runs/small/checkpoints when there is a checkpoint
    metrics = run_pretraining(trainer, checkpoints, count_steps(train_config, ["train.txt"]))
"""

from elmo_tf.pretraining.callbacks import CheckpointEvery, ProgressBar, StepCSVLogger, StopAfterMinutes
from elmo_tf.pretraining.checkpoints import Checkpoints
from elmo_tf.pretraining.config import STOP_REASONS, CheckpointMismatchError, NonFiniteLossError, TrainConfig
from elmo_tf.pretraining.evaluation import evaluate_perplexity
from elmo_tf.pretraining.loop import Controller
from elmo_tf.pretraining.model_dir import load_initial_weights, load_model_dir, write_model_dir, write_train_config
from elmo_tf.pretraining.optimizers import make_optimizer
from elmo_tf.pretraining.run import count_steps, run_pretraining
from elmo_tf.pretraining.step import clip_and_average
from elmo_tf.pretraining.trainer import Trainer

__all__ = [
    "STOP_REASONS",
    "CheckpointEvery",
    "CheckpointMismatchError",
    "Checkpoints",
    "Controller",
    "NonFiniteLossError",
    "ProgressBar",
    "StepCSVLogger",
    "StopAfterMinutes",
    "TrainConfig",
    "Trainer",
    "clip_and_average",
    "count_steps",
    "evaluate_perplexity",
    "load_initial_weights",
    "load_model_dir",
    "make_optimizer",
    "run_pretraining",
    "write_model_dir",
    "write_train_config",
]
