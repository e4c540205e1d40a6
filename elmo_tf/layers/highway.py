"""Highway layers of the ELMo token encoder."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="elmo_tf")
class Highway(keras.layers.Layer):
    """`y = g * relu(x W_t + b_t) + (1 - g) * x` with `g = sigmoid(x W_c + b_c)`, stacked `num_layers` times.

    bilm-tf's "carry" weights (`CNN_high_k/W_carry`) are the gate `g` on the nonlinear branch.

    Args:
        num_layers: how many highway layers (>= 0).
        activation: nonlinearity of the transform branch (relu in the released models).
    Call arguments:
        inputs: float `(..., dim)`.
    Returns:
        float `(..., dim)`.
    """

    def __init__(self, num_layers=1, activation="relu", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 0:
            raise ValueError(f"num_layers must be a non-negative int, got {num_layers!r}")
        self.num_layers = num_layers
        self.activation = keras.activations.get(activation)
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

    def call(self, inputs):
        x = inputs
        for k in range(self.num_layers):
            gate = ops.sigmoid(ops.matmul(x, self.carry_kernels[k]) + self.carry_biases[k])
            transform = self.activation(ops.matmul(x, self.transform_kernels[k]) + self.transform_biases[k])
            x = gate * transform + (1.0 - gate) * x
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, activation=keras.activations.serialize(self.activation))
        return config
