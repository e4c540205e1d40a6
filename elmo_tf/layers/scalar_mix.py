"""ScalarMix: the task-specific weighting of the biLM layers."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="elmo_tf")
class ScalarMix(keras.layers.Layer):
    """`gamma * sum_k softmax(w)_k * h_k` over the layers of a biLM (Peters et al. 2018, eq. 1).

    Args:
        num_layers: how many tensors are mixed (L + 1 for an L-layer biLM).
        layer_norm: normalize each layer first, over its unmasked positions and all features, per sentence
            (a sentence never depends on its batch-mates).
        initial_weights: the pre-softmax weights `w` to start from (default zeros: equal weights).
        weights_trainable: whether `w` is trained; False fixes the weights (e.g. [0, 0, 1]: top layer
            only, or equal weights: the plain average).
        initial_gamma: start value of `gamma`.
        trainable_gamma: whether `gamma` is trained.
        l2_coef: adds `l2_coef * sum(w^2)` to the model losses (bilm-tf's regularization of `w`).
    Call arguments:
        inputs: list of `num_layers` float tensors `(batch, tokens, dim)`.
        mask: bool `(batch, tokens)`, True for real tokens.
    Returns:
        float `(batch, tokens, dim)`, zeros at masked positions.
    """

    def __init__(
        self,
        num_layers,
        layer_norm=False,
        initial_weights=None,
        weights_trainable=True,
        initial_gamma=1.0,
        trainable_gamma=True,
        l2_coef=0.0,
        epsilon=1e-12,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        if initial_weights is not None:
            initial_weights = [float(w) for w in initial_weights]
            if len(initial_weights) != num_layers:
                raise ValueError(f"initial_weights must have num_layers={num_layers} values, got {initial_weights}")
        if l2_coef < 0:
            raise ValueError(f"l2_coef must be >= 0, got {l2_coef!r}")
        self.num_layers = num_layers
        self.layer_norm = bool(layer_norm)
        self.initial_weights = initial_weights
        self.weights_trainable = bool(weights_trainable)
        self.initial_gamma = float(initial_gamma)
        self.trainable_gamma = bool(trainable_gamma)
        self.l2_coef = float(l2_coef)
        self.epsilon = float(epsilon)
        self.supports_masking = True

    def build(self, input_shape):
        init = keras.initializers.Constant(self.initial_weights) if self.initial_weights is not None else "zeros"
        self.scalar_weights = self.add_weight(
            name="scalar_weights", shape=(self.num_layers,), initializer=init, trainable=self.weights_trainable
        )
        self.gamma = self.add_weight(
            name="gamma",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_gamma),
            trainable=self.trainable_gamma,
        )

    def _normalize(self, x, mask):
        # mean and variance over the real tokens of each sentence and all features
        m = ops.cast(mask, x.dtype)[:, :, None]
        count = ops.maximum(ops.sum(m, axis=(1, 2), keepdims=True) * ops.cast(ops.shape(x)[-1], x.dtype), 1.0)
        mean = ops.sum(x * m, axis=(1, 2), keepdims=True) / count
        var = ops.sum(ops.square((x - mean) * m), axis=(1, 2), keepdims=True) / count
        return (x - mean) / ops.sqrt(var + self.epsilon)

    def call(self, inputs, mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != self.num_layers:
            raise ValueError(
                f"ScalarMix expects a list of num_layers={self.num_layers} tensors, got "
                f"{len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs).__name__}"
            )
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if mask is None:
            mask = ops.ones(ops.shape(inputs[0])[:2], "bool")
        weights = ops.softmax(self.scalar_weights)
        if self.l2_coef:
            self.add_loss(self.l2_coef * ops.sum(ops.square(self.scalar_weights)))
        total = 0.0
        for k, h in enumerate(inputs):
            total = total + weights[k] * (self._normalize(h, mask) if self.layer_norm else h)
        return self.gamma * total * ops.cast(mask, total.dtype)[:, :, None]

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else mask

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            layer_norm=self.layer_norm,
            initial_weights=self.initial_weights,
            weights_trainable=self.weights_trainable,
            initial_gamma=self.initial_gamma,
            trainable_gamma=self.trainable_gamma,
            l2_coef=self.l2_coef,
            epsilon=self.epsilon,
        )
        return config
