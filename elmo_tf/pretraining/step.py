"""The compiled training step: per replica the loss and its gradients, all-reduced, clipped by their global norm
(`clip_and_average`), applied.

Loss per step = mean over all target tokens of all replicas of 0.5 * (forward + backward) cross-entropy: each
replica divides its sum by the all-reduced global count. Gradients are all-reduced, then clipped by their global
norm (Keras would clip per replica, before the all-reduce), then applied.
"""

import tensorflow as tf


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def clip_and_average(grads, clip, replicas):
    """`tf.clip_by_global_norm(grads, clip)` divided by `replicas`, in one multiply per gradient, and none when
    there is nothing to do (one replica and a global norm <= `clip`): each multiply is a pass over the gradient's
    memory (98.7M floats at the original shapes).

    Args:
        grads: gradients summed over the replicas (tensors or `tf.IndexedSlices`).
        clip: the global-norm bound (> 0).
        replicas: how many replicas the sum is over.
    Returns:
        the scaled gradients, `g * clip * min(1 / norm, 1 / clip) / replicas` with `norm = tf.linalg.global_norm(grads)`
        (NaN everywhere when the norm is not finite, as `tf.clip_by_global_norm` does).
    """
    norm = tf.linalg.global_norm(grads)
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)  # (norm - norm): NaN when norm is inf/NaN

    def scaled():
        factor = scale / replicas  # one scalar op, not one per gradient
        return [_scale(g, factor) for g in grads]

    return tf.cond(norm <= clip, lambda: list(grads), scaled) if replicas == 1 else scaled()


def compile_train_step(strategy, model, optimizer, step, clip):
    """The compiled step: `train_step(iterator)` -> `(forward_sum, backward_sum, count)` summed over replicas."""
    replicas = strategy.num_replicas_in_sync

    def replica_step(batch):
        ctx = tf.distribute.get_replica_context()
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            fwd, bwd, count = model.losses_sum(batch, training=True)
            global_count = tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, count), 1.0)
            loss = 0.5 * (fwd + bwd) / global_count
        grads = tape.gradient(loss, variables)
        if clip:
            # clip the global gradient, then let the optimizer's own SUM all-reduce rebuild it exactly
            grads = clip_and_average(ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads), clip, replicas)
        optimizer.apply_gradients(zip(grads, variables))
        return fwd, bwd, count

    @tf.function(autograph=False)  # no Python control flow on tensors: AutoGraph would only cost tracing time
    def train_step(iterator):
        fwd, bwd, count = strategy.run(replica_step, args=(next(iterator),))
        total = [strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None) for x in (fwd, bwd, count)]
        step.assign_add(1)
        return total

    return train_step
