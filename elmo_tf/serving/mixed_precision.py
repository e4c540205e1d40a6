"""`--mixed_precision`: stock TF Serving's flag, done as stock does it.

What stock does (tensorflow_serving/model_servers/main.cc binds the flag to `Options::mixed_precision`, a string, empty
by default; server.cc copies it into the `SessionBundleConfig`; `SavedModelBundleFactory::
InternalCreateSavedModelBundle` in servables/tensorflow/saved_model_bundle_factory.cc reads it for every model version
it loads):
    - "bfloat16": logs "Running inference with bfloat16 auto mixed precision" (INFO) and turns on the session's grappler
      pass `auto_mixed_precision_onednn_bfloat16` (`RewriterConfig`), which rewrites the graph's float32 ops that
      oneDNN runs in bfloat16 (MatMul, Conv2D, ...) to bfloat16, with casts around them;
    - any other non-empty value: logs "<value> auto mixed precision is not supported. Valid option: bfloat16"
      (WARNING) and loads the model in float32: not an error, the server starts;
    - empty (the default): nothing.

The embedded server runs its models as TensorFlow functions in this process (`tf.saved_model.load`), whose grappler
options are the process's: `tf.config.optimizer.set_experimental_options`, the same `RewriterConfig` field, set before
each version loads (a function is rewritten when it is first run, at the warm-up). It is a server-wide setting here
as in stock, and it stays on in the process once set.

TensorFlow registers that pass only where its oneDNN optimizations are on: by default on CPUs with AVX-512, or with
TF_ENABLE_ONEDNN_OPTS=1 (stock TF Serving's oneDNN builds). Elsewhere (an AVX2-only CPU) nothing is rewritten and the
model computes in float32; a warning says so. A model exported with `elmo-tf export --precision bfloat16` computes in
bfloat16 already, on any CPU and under any server, with the rounding elmo_tf chooses (float32 cell state, gates and
outputs): that is the way to serve ELMo in bfloat16; this flag is for parity with stock's command line.
"""

import logging

logger = logging.getLogger(__name__)

MIXED_PRECISION = "bfloat16"  # the one value stock takes
GRAPPLER_PASS = "auto_mixed_precision_onednn_bfloat16"  # the RewriterConfig field stock turns on


def onednn_enabled():
    """Whether TensorFlow's oneDNN optimizations are on in this process (its `IsMklEnabled`), which the grappler pass
    needs."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def check_mixed_precision(value):
    """`value` (`ServerOptions.mixed_precision`) if it is a string; ValueError naming it otherwise. Any string is taken,
    as stock takes it (`apply_mixed_precision` logs a value it does not support)."""
    if not isinstance(value, str):
        raise ValueError(f"mixed_precision must be a string (bfloat16, or empty for none), got {value!r}")
    return value


def apply_mixed_precision(value):
    """Does what stock does with `--mixed_precision=value` before a version loads (see the module docstring): turns on
    the bfloat16 grappler pass for "bfloat16", logs a warning for any other non-empty value. Returns True when the pass
    is on."""
    if not value:
        return False
    if value != MIXED_PRECISION:
        logger.warning("%s auto mixed precision is not supported. Valid option: %s", value, MIXED_PRECISION)
        return False
    import tensorflow as tf

    logger.info("Running inference with bfloat16 auto mixed precision")
    tf.config.optimizer.set_experimental_options({GRAPPLER_PASS: True})
    if not onednn_enabled():
        logger.warning(
            "--mixed_precision=%s: TensorFlow's oneDNN optimizations are off in this process (a CPU without AVX-512, "
            "or TF_ENABLE_ONEDNN_OPTS=0), so its %s pass does not run and the model computes in float32 "
            "(TF_ENABLE_ONEDNN_OPTS=1 turns it on; without AVX512_BF16 its bfloat16 is emulated, slower); an export "
            "of `elmo-tf export --precision bfloat16` computes in bfloat16 on any CPU",
            value,
            GRAPPLER_PASS,
        )
    return True


__all__ = ["GRAPPLER_PASS", "MIXED_PRECISION", "apply_mixed_precision", "check_mixed_precision", "onednn_enabled"]
