"""`CheckpointEvery`: saves a run's checkpoints every n steps and when training ends."""

import logging

import keras

from elmo_tf.errors import check_int

log = logging.getLogger(__name__)


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
