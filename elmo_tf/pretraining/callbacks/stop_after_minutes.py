"""`StopAfterMinutes`: stops training once the run's training wall time reaches a budget."""

import logging

import keras

log = logging.getLogger(__name__)


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
