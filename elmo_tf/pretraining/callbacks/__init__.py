"""The pretraining loop's own Keras callbacks, one per file; `keras.callbacks.TensorBoard` is used as it is."""

from elmo_tf.pretraining.callbacks.checkpoint_every import CheckpointEvery
from elmo_tf.pretraining.callbacks.progress_bar import ProgressBar
from elmo_tf.pretraining.callbacks.step_csv_logger import StepCSVLogger
from elmo_tf.pretraining.callbacks.stop_after_minutes import StopAfterMinutes

__all__ = ["CheckpointEvery", "ProgressBar", "StepCSVLogger", "StopAfterMinutes"]
