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

from elmo_tf import _lazy

# `config` alone needs no TensorFlow: the pretrain command line reads its flags from it
__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.pretraining.callbacks": ("CheckpointEvery", "ProgressBar", "StepCSVLogger", "StopAfterMinutes"),
        "elmo_tf.pretraining.checkpoints": ("Checkpoints",),
        "elmo_tf.pretraining.config": ("STOP_REASONS", "CheckpointMismatchError", "NonFiniteLossError", "TrainConfig"),
        "elmo_tf.pretraining.evaluation": ("evaluate_perplexity",),
        "elmo_tf.pretraining.loop": ("Controller",),
        "elmo_tf.pretraining.model_dir": (
            "load_initial_weights",
            "load_model_dir",
            "write_model_dir",
            "write_train_config",
        ),
        "elmo_tf.pretraining.optimizers": ("make_optimizer",),
        "elmo_tf.pretraining.run": ("count_steps", "run_pretraining"),
        "elmo_tf.pretraining.step": ("clip_and_average",),
        "elmo_tf.pretraining.trainer": ("Trainer",),
    },
)
