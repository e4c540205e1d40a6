"""`StepCSVLogger`: Keras' CSVLogger with its columns fixed up front (one row per logging window)."""

import keras

from elmo_tf.io.atomic import write_error


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
