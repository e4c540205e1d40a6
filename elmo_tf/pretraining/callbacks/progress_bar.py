"""`ProgressBar`: a `keras.utils.Progbar` over the run's steps."""

import math

import keras


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
