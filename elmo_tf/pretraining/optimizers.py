"""Adagrad and Adam as Keras optimizers whose update is one fused TensorFlow kernel per variable.

Keras 3 writes each update as separate ops (square, add, sqrt, divide, assign), and each op is a pass over the
variable's memory: at the original biLM shapes (98.7M parameters) Keras' Adagrad update took 531 ms of a 10.5 s
training step on 2 cores. TensorFlow's training kernels (`ResourceApplyAdagradV2`, `ResourceApplyAdam`, the ones
tf.keras 2 and TF1's optimizers ran) read and write each array once.

Sparse gradients: the biLM's softmax rows and character embeddings get `tf.IndexedSlices` gradients with repeated
indices (a word is the target of many positions of a batch). Keras 3 applies them with scatter ops that treat each
repeat apart, so Adagrad's accumulator gains `sum_k g_k^2` where the dense gradient `g = sum_k g_k` gives `g^2`
(measured: accumulator 1 + 1^2 + 2^2 = 6 for two rows 1 and 2 at one index, against 1 + 3^2 = 10 dense). Here
repeats are summed first, as TF1's `AdagradOptimizer` (bilm-tf's) did, so a sparse gradient updates a variable
exactly as the dense gradient it stands for.
"""

import keras
import tensorflow as tf


def _resource(variable):
    """The resource handle of a Keras or tf variable (inside `strategy.extended.update`, the local replica's)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def _sum_duplicates(gradient):
    """`(values, indices)` of an `IndexedSlices` with each index once, the rows of repeated indices summed."""
    indices, positions = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(indices)[0])
    return values, indices


@keras.saving.register_keras_serializable(package="elmo_tf")
class FusedAdagrad(keras.optimizers.Adagrad):
    """Adagrad, `acc += g^2; w -= lr * g / (sqrt(acc) + epsilon)`, in one kernel per variable.

    Same arguments, variables and checkpoint layout as `keras.optimizers.Adagrad`. Two differences from it:
    `epsilon` is added after the square root (TensorFlow's kernel, tf.keras 2's Adagrad; Keras 3 adds it under the
    root: with the accumulator >= `initial_accumulator_value` the two differ by less than `epsilon` relatively), and
    repeated indices of a sparse gradient are summed before the update (see the module docstring). Sparse gradients
    update only their rows (`ResourceSparseApplyAdagradV2`), which is what the dense update does to the others.
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        accumulator = self._accumulators[self._get_variable_index(variable)]
        lr, epsilon = tf.cast(learning_rate, dtype), tf.cast(self.epsilon, dtype)
        if isinstance(gradient, tf.IndexedSlices):
            values, indices = _sum_duplicates(gradient)
            tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=_resource(variable),
                accum=_resource(accumulator),
                lr=lr,
                epsilon=epsilon,
                grad=tf.cast(values, dtype),
                indices=indices,
            )
        else:
            tf.raw_ops.ResourceApplyAdagradV2(
                var=_resource(variable),
                accum=_resource(accumulator),
                lr=lr,
                epsilon=epsilon,
                grad=tf.cast(gradient, dtype),
            )


@keras.saving.register_keras_serializable(package="elmo_tf")
class FusedAdam(keras.optimizers.Adam):
    """Adam, Keras 3's formula (`m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
    w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)`), in one kernel per variable (`ResourceApplyAdam`).

    Same arguments, variables and checkpoint layout as `keras.optimizers.Adam`. A sparse gradient is made dense
    first (its repeated indices summed): Adam moves every row's moments each step anyway, and Keras 3's sparse path
    treats repeats apart (see the module docstring). `amsgrad=True` runs Keras' own update (no fused kernel has it).
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_resource(variable),
            m=_resource(self._momentums[index]),
            v=_resource(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
        )


def make_optimizer(config):
    """The Keras optimizer a `TrainConfig` names (Adagrad as in bilm-tf: initial accumulator 1.0). Adagrad and Adam
    are the fused ones above (one kernel per variable, repeated sparse indices summed)."""
    if config.optimizer == "adagrad":
        return FusedAdagrad(config.learning_rate, initial_accumulator_value=1.0, epsilon=1e-7)
    if config.optimizer == "adam":
        return FusedAdam(config.learning_rate)
    return keras.optimizers.SGD(config.learning_rate)
