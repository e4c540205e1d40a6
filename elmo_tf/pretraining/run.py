"""A whole pretraining run once the trainer is restored: `count_steps` (epochs -> steps) and `run_pretraining`
(train_config.json, the loop with the run's callbacks, validation, the model directory, metrics.json)."""

import logging
import math
import os

import keras

from elmo_tf.config import INT64_MAX, ConfigError
from elmo_tf.io.atomic import write_json
from elmo_tf.pretraining.callbacks import CheckpointEvery, ProgressBar, StepCSVLogger, StopAfterMinutes
from elmo_tf.pretraining.config import NonFiniteLossError
from elmo_tf.pretraining.model_dir import write_model_dir, write_train_config

log = logging.getLogger(__name__)


def count_pieces(files, max_tokens):
    """Training sentences per pass (lines cut into pieces of at most `max_tokens`), streamed."""
    total = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                n = len(line.split())
                total += -(-n // max_tokens)
    return total


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
