"""A run's checkpoints: restore (resume rules, all workers agreeing), save (never non-finite weights; a full
disk leaves the previous checkpoints as they were)."""

import dataclasses
import glob
import json
import logging
import math
import os
import shutil

import tensorflow as tf

from elmo_tf.io.atomic import write_error
from elmo_tf.pretraining.config import DATA_ORDER_FIELDS, CheckpointMismatchError, NonFiniteLossError
from elmo_tf.pretraining.distribute import any_worker, num_workers

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoints of a `Trainer` in `<output_dir>/checkpoints`: model, optimizer, `step` and `train_seconds`
    through a `tf.train.CheckpointManager` that keeps the last `max_to_keep`.

    A non-chief worker of a multi-worker run must save too (the save runs collectives) but somewhere
    disposable that is still its own between runs: `<output_dir>/.worker_<task id>_checkpoints`, so a rerun
    resumes every worker from the same step. Building this object reads the directory's `checkpoint` state
    file (if any) and writes nothing.

    Args:
        trainer: the `Trainer` whose state is saved.
        output_dir: the run directory.
        max_to_keep: checkpoints kept (older ones are deleted).
    """

    def __init__(self, trainer, output_dir, max_to_keep=3):
        self.trainer = trainer
        self.output_dir = os.fspath(output_dir)
        if trainer.chief:
            self.directory = os.path.join(self.output_dir, "checkpoints")
        else:
            task = trainer.strategy.cluster_resolver.task_id
            self.directory = os.path.join(self.output_dir, f".worker_{task}_checkpoints")
        self.checkpoint = tf.train.Checkpoint(
            model=trainer.model, optimizer=trainer.optimizer, step=trainer.step, train_seconds=trainer.train_seconds
        )
        self.max_to_keep = max_to_keep
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=max_to_keep)
        self._probe_batch = None

    @property
    def latest(self):
        """Path prefix of the newest checkpoint, or None."""
        return self.manager.latest_checkpoint

    def probe_batch(self):
        """The batch `save` checks the weights on (the first 8 training sentences), read on the first call."""
        if self._probe_batch is None:
            self._probe_batch = self.trainer.first_batch(8)
        return self._probe_batch

    def restore(self):
        """Restores the newest checkpoint, if any; returns True when it did (a resumed run).

        The learning rate of `TrainConfig` wins over the checkpoint's (the flag of the rerun applies). Checkpoints
        written before `train_seconds` was saved restore with the training time starting at 0. In a multi-worker
        run every worker must call this (it ends with a collective check that all restored the same step).

        The settings that decide the data order (`DATA_ORDER_FIELDS` and the replica count) must be the run's
        own, as its `train_config.json` records them (all workers refuse together): the resumed run skips the
        batches already trained, which are the same batches only under the same settings. Other files than the
        run's are logged as a warning (more data may be meant). Other settings (steps, learning rate, dropout,
        clipping, ...) may change between runs.

        Raises:
            CheckpointMismatchError: the checkpoint does not fit the model or optimizer, the data order differs
                from the run's, or the workers restored different steps.
        """
        path = self.latest
        refusal = self._data_order_refusal(path) if path else None
        # decided together: a worker that raised alone would leave the others waiting in the next collective
        if any_worker(self.trainer.strategy, refusal is not None) and refusal is None:
            refusal = f"another worker refused to resume from {path}: its run records another data order (see its log)"
        if refusal:
            raise CheckpointMismatchError(refusal)
        if path:
            saved = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
            checkpoint = self.checkpoint
            if "train_seconds" not in saved:
                trainer = self.trainer
                checkpoint = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer, step=trainer.step)
            try:
                checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError) as e:
                raise CheckpointMismatchError(
                    f"checkpoint {path} does not fit this model and optimizer ({' '.join(str(e).split())[:300]}); "
                    f"resume with the run's own configuration or use a new output directory"
                ) from None
            restored_lr = float(self.trainer.optimizer.learning_rate.numpy())
            wanted_lr = self.trainer.config.learning_rate
            if not math.isclose(restored_lr, wanted_lr, rel_tol=1e-6):  # the variable is float32
                log.info("learning rate %g from the checkpoint replaced by %g", restored_lr, wanted_lr)
            self.trainer.optimizer.learning_rate.assign(wanted_lr)
            log.info("resumed from %s at step %d", path, int(self.trainer.step.numpy()))
        self._check_workers_agree()
        return path is not None

    def _data_order_refusal(self, path):
        """Why resuming from `path` would train on another data order than the run's: this trainer's data-order
        settings or replica count differ from those in the run's `train_config.json`; None when they agree (a
        run without a readable one, e.g. a non-chief worker's, is not checked)."""
        config_path = os.path.join(self.output_dir, "train_config.json")
        try:
            with open(config_path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
            log.warning("%s unreadable (%s); the data order of the resumed run is not checked", config_path, e)
            return None
        run = saved.get("train") if isinstance(saved, dict) else None
        if not isinstance(run, dict):
            log.warning("%s holds no 'train' settings; the data order of the resumed run is not checked", config_path)
            return None
        ours = dataclasses.asdict(self.trainer.config)
        changed = [
            f"{name} {run[name]!r} -> {ours[name]!r}"
            for name in DATA_ORDER_FIELDS
            if run.get(name, ours[name]) != ours[name]
        ]
        replicas = self.trainer.strategy.num_replicas_in_sync
        if isinstance(saved.get("replicas"), int) and saved["replicas"] != replicas:
            changed.append(f"replicas {saved['replicas']} -> {replicas}")  # each replica's batches are bucketed apart
        files = saved.get("train_files")
        if isinstance(files, list) and [os.path.basename(str(f)) for f in files] != [
            os.path.basename(f) for f in self.trainer.train_files
        ]:  # a warning: more data on resume may be meant; paths are compared by name (relative globs, another cwd)
            log.warning(
                "the training files differ from the run's (%d files, was %d, %s): the resumed run does not continue "
                "at the same data position",
                len(self.trainer.train_files),
                len(files),
                config_path,
            )
        if not changed:
            return None
        return (
            f"checkpoint {path} was trained with another data order ({'; '.join(changed)}, from {config_path}): "
            "a resumed run skips the batches already trained, which are the same batches only with the run's own "
            "batch size, max tokens, shuffle buffer, bucket width, seed and replica count; rerun with those or use "
            "a new output directory"
        )

    def _check_workers_agree(self):
        """All workers must resume from the same step, or their collectives pair up out of step."""
        strategy = self.trainer.strategy
        if num_workers(strategy) <= 1:
            return
        step = tf.cast(self.trainer.step, tf.float64)
        moments = strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, tf.stack([step, step * step])
            )
        )
        mean, mean_square = [float(v) for v in strategy.experimental_local_results(moments)[0]]
        if mean_square - mean * mean > 1e-6:  # a non-zero variance: not every worker is at the same step
            raise CheckpointMismatchError(
                f"workers restored different steps (this one {int(self.trainer.step.numpy())}, mean {mean:g}): "
                f"every worker must keep its checkpoint directory under {self.output_dir!r} between runs"
            )

    def save(self):
        """Saves the current state as `ckpt-<step>` and returns its path, unless its weights give a non-finite
        loss on the probe batch: then `NonFiniteLossError` and nothing is written (divergence shows in the
        weights one step before it shows in a training loss).

        Raises:
            elmo_tf.io.atomic.WriteError: the disk refused the checkpoint (full: ENOSPC; a file-size limit: EFBIG,
                which TensorFlow reports as ResourceExhaustedError / OutOfRangeError from SaveV2). What it wrote
                of this checkpoint is removed (`ckpt-<step>_temp/`, partial shards, the state file's temporary);
                the previous checkpoints and the `checkpoint` state file are as they were.
        """
        fwd, bwd, _ = self.trainer.probe_loss(self.probe_batch())
        step = int(self.trainer.step.numpy())
        if not math.isfinite(float(fwd) + float(bwd)):
            raise NonFiniteLossError(f"the weights after step {step} give a non-finite loss; not saved")
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        try:
            return self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            error = write_error(prefix, e)
            if error is None:
                raise
            self._remove_unfinished(prefix)
            raise error from None

    def _remove_unfinished(self, prefix):
        """Removes what a failed save of `prefix` left: its `_temp` directory, TensorFlow's temporaries of the state
        file, and its own files unless the state file on disk already names it (then only the bookkeeping after it
        failed, and the checkpoint is whole)."""
        state = tf.train.get_checkpoint_state(self.directory)
        recorded = state is not None and prefix in {state.model_checkpoint_path, *state.all_model_checkpoint_paths}
        leftovers = [prefix + "_temp"] + glob.glob(glob.escape(self.directory) + "/checkpoint.tmp*")
        if not recorded:
            leftovers += glob.glob(glob.escape(prefix) + ".*")
        for path in leftovers:
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError as e:
                log.warning("cannot remove %s, left by a failed checkpoint: %s", path, e)
        # the manager's own list may hold the checkpoint that failed: read the state file again
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=self.max_to_keep)
