"""The outer loop around a trainer's compiled step, as Orbit's controller runs a trainer: steps in logging
windows, Keras callbacks, validation, and the stop that every worker agrees on.

`model.fit` fails under MultiWorkerMirroredStrategy in Keras 3 (keras-team/keras#20585), so this one custom loop
(`distribute_datasets_from_function` + `strategy.run`) serves one device, mirrored replicas and multiple workers
alike.
"""

import logging
import math
import time

import keras

from elmo_tf.errors import check_int
from elmo_tf.pretraining.config import NonFiniteLossError
from elmo_tf.pretraining.distribute import any_worker

log = logging.getLogger(__name__)


class Controller:
    """Runs a trainer from its current `step` up to `total_steps`, calling Keras callbacks (`run` returns the last
    logs). The trainer is any object with `model`, `config` (a `TrainConfig`), `strategy`, `step`, `train_seconds`,
    `train_step(iterator)`, `distributed_dataset(start_step)` and `validate()`: a `Trainer`.

    How the loop maps onto `keras.callbacks.Callback` hooks (the Keras convention for a custom loop:
    a `keras.callbacks.CallbackList` with `model=trainer.model`):
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
          ends after the step or window where it was set, normally; in a multi-worker run every worker stops
          there when any one sets it), "interrupted" (KeyboardInterrupt, or SystemExit such as SIGTERM through
          `elmo_tf.cli`), "non_finite" (`NonFiniteLossError`), or "error". The exception itself is re-raised
          after `on_train_end`.
        - callback params: `total_steps`, `initial_step`, `log_every`, `validate_every`, and for Keras'
          own callbacks `verbose` = 1, `epochs` = total_steps (the last epoch index), `steps` = log_every.

    Args:
        trainer: the `Trainer` whose step runs.
        total_steps: train until `step` reaches this (int >= 1); nothing runs when it already has.
        callbacks: list of `keras.callbacks.Callback` (or a `CallbackList`).
        log_every: steps per logging window (default `TrainConfig.log_every`).
        validate_every: steps between validations (default `TrainConfig.validate_every`; 0: never here,
            `run_pretraining` validates at the end).
    Raises (from `run`):
        NonFiniteLossError: the loss of a step is NaN or inf (nothing more is saved).
    """

    def __init__(self, trainer, total_steps, callbacks=None, log_every=None, validate_every=None):
        config = trainer.config
        self.trainer = trainer
        self.total_steps = check_int("total_steps", total_steps, 1)
        self.log_every = check_int("log_every", config.log_every if log_every is None else log_every, 1)
        self.validate_every = check_int(
            "validate_every", config.validate_every if validate_every is None else validate_every, 0
        )
        self.start = int(trainer.step.numpy())
        self._iterator = None  # the training batches' iterator while `run` runs
        params = {
            "total_steps": self.total_steps,
            "initial_step": self.start,
            "log_every": self.log_every,
            "validate_every": self.validate_every,
            "verbose": 1,
            "epochs": self.total_steps,
            "steps": self.log_every,
        }
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks.set_model(trainer.model)
            callbacks.set_params(params)
        else:
            callbacks = keras.callbacks.CallbackList(callbacks, model=trainer.model, **params)
        self.callbacks = callbacks

    def run(self):
        """Runs the loop. Returns dict: the last epoch logs (empty when no step ran) with `step` and `stop_reason`."""
        trainer, callbacks = self.trainer, self.callbacks
        self._iterator = iter(trainer.distributed_dataset(self.start))
        trainer.model.stop_training = False
        self._base_seconds, self._began, self._paused = float(trainer.train_seconds.numpy()), time.perf_counter(), 0.0
        step, logs, reason, stop = self.start, {}, "error", False
        callbacks.on_train_begin({"step": self.start, "elapsed_minutes": self._base_seconds / 60})
        try:
            while step < self.total_steps and not stop:
                step, logs, stop = self._window(step)
                stop = stop or self._stop_requested()
            reason = "steps" if step >= self.total_steps else "stop_training"
        except NonFiniteLossError:
            reason = "non_finite"
            raise
        except (KeyboardInterrupt, SystemExit):
            reason = "interrupted"
            log.warning("interrupted at step %d", int(trainer.step.numpy()))
            raise
        finally:
            # The input pipeline and its threads go now, also when an error's traceback keeps this loop's frames (they
            # hold `self`, not the iterator): left to the garbage collector, the iterator's destructor waits for those
            # threads inside whatever code the collection interrupts.
            self._iterator = None
            callbacks.on_train_end(dict(logs, step=int(trainer.step.numpy()), stop_reason=reason))
        return dict(logs, step=step, stop_reason=reason)

    def _elapsed_seconds(self):
        """Training wall time of the run: the restored `train_seconds`, then this loop's time less validation."""
        return self._base_seconds + time.perf_counter() - self._began - self._paused

    def _window(self, step):
        """One logging window from `step`: its steps, then validation when due and `on_epoch_end`.
        Returns `(step, epoch logs, stop)`, `stop` True when a worker asked to stop inside the window."""
        window_start = step
        window_end = min(self.total_steps, (step // self.log_every + 1) * self.log_every)
        self.callbacks.on_epoch_begin(window_end)
        window_loss = window_count = 0.0
        window_began = time.perf_counter()
        stop = False
        while step < window_end:
            step, loss_sum, count, seconds = self._step(step)
            window_loss += loss_sum
            window_count += count
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
        if self.validate_every and step // self.validate_every > window_start // self.validate_every:
            validation_began = time.perf_counter()
            valid = self.trainer.validate()
            self._paused += time.perf_counter() - validation_began
            if valid:
                logs["val_perplexity"] = valid["average"]
        self.callbacks.on_epoch_end(step, logs)
        return step, logs, stop

    def _step(self, step):
        """Step `step + 1` between its batch hooks. Returns `(step + 1, 0.5 * (forward + backward) loss sum,
        target count, training seconds so far)`.

        Raises:
            NonFiniteLossError: the step's loss is NaN or inf.
        """
        self.callbacks.on_train_batch_begin(step + 1)
        fwd, bwd, count = self.trainer.train_step(self._iterator)
        fwd, bwd, count = float(fwd), float(bwd), float(count)
        step += 1
        if not math.isfinite(fwd + bwd):
            raise NonFiniteLossError(f"loss is {fwd + bwd} at step {step}; stopped without saving")
        seconds = self._elapsed_seconds()
        self.trainer.train_seconds.assign(seconds)
        batch_logs = {
            "step": step,
            "loss": 0.5 * (fwd + bwd) / max(count, 1.0),
            "tokens": count,
            "elapsed_minutes": seconds / 60,
        }
        self.callbacks.on_train_batch_end(step, batch_logs)
        return step, 0.5 * (fwd + bwd), count, seconds

    def _stop_requested(self):
        """Whether any worker's `model.stop_training` is set (then it is set on every worker)."""
        model = self.trainer.model
        stop = any_worker(self.trainer.strategy, bool(getattr(model, "stop_training", False)))
        if stop:
            model.stop_training = True
        return stop
