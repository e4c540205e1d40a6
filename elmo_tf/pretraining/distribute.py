"""`tf.distribute` strategies by name, and what the pretraining loop asks of them (chief, workers, agreement)."""

import json
import os

import tensorflow as tf

STRATEGIES = ("mirrored", "multi_worker", "one_device")


def set_cpu_replicas(n):
    """Splits the CPU into `n` logical devices (for MirroredStrategy on one CPU); call before any op runs."""
    if n < 1:
        raise ValueError(f"cpu replicas must be >= 1, got {n}")
    if n > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


def get_strategy(name="mirrored"):
    """`mirrored` (all local devices), `multi_worker` (from TF_CONFIG, RING collectives), `one_device`."""
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy 'multi_worker' needs the TF_CONFIG environment variable (cluster and task)")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    raise ValueError(f"unknown strategy {name!r}: choose one of {STRATEGIES}")


def is_chief(strategy):
    """True on the worker that writes outputs (always True off multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return (
        task_type is None
        or task_type == "chief"
        or (task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict())
    )


def num_workers(strategy):
    """How many workers run `strategy` (1 off multi-worker)."""
    return getattr(strategy.extended, "_num_workers", 1)


def any_worker(strategy, flag):
    """`flag` or-ed over the workers (one all-reduce; only in a multi-worker run): every worker stops (or refuses)
    at the same point, or the next collectives would wait forever for the one that stopped."""
    if num_workers(strategy) <= 1:
        return flag
    value = tf.constant(1.0 if flag else 0.0)
    total = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value))
    return float(strategy.experimental_local_results(total)[0]) > 0
