"""Highway layers of the ELMo token encoder."""

import keras
from keras import ops

from elmo_tf.layers import low_precision


@keras.saving.register_keras_serializable(package="elmo_tf")
class Highway(keras.layers.Layer):
    """`y = g * relu(x W_t + b_t) + (1 - g) * x` with `g = sigmoid(x W_c + b_c)`, stacked `num_layers` times.

    bilm-tf's "carry" weights (`CNN_high_k/W_carry`) are the gate `g` on the nonlinear branch.

    Args:
        num_layers: how many highway layers (>= 0).
        activation: nonlinearity of the transform branch (relu in the released models).
        precision: "float32" (default), "bfloat16" or "auto" (`elmo_tf.precision`): with bfloat16 the two matmuls
            of each layer take bfloat16 operands (the kernels' copies, `low_precision`) with float32 accumulation;
            the biases, gate and mix stay float32. The attribute `precision` is the computed one.
    Call arguments:
        inputs: float `(..., dim)`.
    Returns:
        float32 `(..., dim)`.
    """

    def __init__(self, num_layers=1, activation="relu", precision="float32", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(f"num_layers must be a non-negative int, got {num_layers!r}")
        self.num_layers = num_layers
        self.activation = keras.activations.get(activation)
        self.requested_precision, self.precision = low_precision.layer_precision(precision)
        self.supports_masking = True

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim is None:
            raise ValueError(f"Highway needs a known last dimension, got input shape {input_shape}")
        self.carry_kernels, self.carry_biases = [], []
        self.transform_kernels, self.transform_biases = [], []
        for k in range(self.num_layers):
            self.carry_kernels.append(
                self.add_weight(name=f"carry_kernel_{k}", shape=(dim, dim), initializer="glorot_uniform")
            )
            self.carry_biases.append(self.add_weight(name=f"carry_bias_{k}", shape=(dim,), initializer="zeros"))
            self.transform_kernels.append(
                self.add_weight(name=f"transform_kernel_{k}", shape=(dim, dim), initializer="glorot_uniform")
            )
            self.transform_biases.append(self.add_weight(name=f"transform_bias_{k}", shape=(dim,), initializer="zeros"))
        low_precision.attach(self, self.carry_kernels + self.transform_kernels)

    def kernels(self):
        """`(carry, transform)` kernels as the matmuls take them: the variables, or their bfloat16 copies."""
        if self.precision != low_precision.LOW:
            return self.carry_kernels, self.transform_kernels
        kernels = low_precision.read(self)
        return kernels[: self.num_layers], kernels[self.num_layers :]

    def call(self, inputs):
        carry, transform = self.kernels()
        multiply = low_precision.matmul if self.precision == low_precision.LOW else ops.matmul
        x = inputs
        for k in range(self.num_layers):
            gate = ops.sigmoid(multiply(x, carry[k]) + self.carry_biases[k])
            x = gate * self.activation(multiply(x, transform[k]) + self.transform_biases[k]) + (1.0 - gate) * x
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, activation=keras.activations.serialize(self.activation))
        config["precision"] = self.requested_precision
        return config
