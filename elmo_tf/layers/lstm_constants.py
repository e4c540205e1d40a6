"""Constants of the projected LSTM that every loop shares: the `keras.ops` one (`ops_recurrence`) and TensorFlow's
(`backends.tensorflow_recurrence`). Imports nothing (a command-line parser reads `MATMUL_DTYPES` without Keras)."""

FORGET_BIAS = 1.0  # added to the forget gate at run time, never stored in the weights (TF1 LSTMCell)
MATMUL_DTYPES = (None, "float32", "bfloat16")  # the dtypes a layer's `matmul_dtype` may name
TENSORFLOW_IMPLEMENTATIONS = ("scan", "fast_gradient")  # a layer's `implementation`s run by TensorFlow's loops only
