"""The precision ELMo computes in: one setting through the whole product (issue 51).

- `"float32"` (the default): the original numbers, exactly.
- `"bfloat16"`: the matmuls' operands (char CNN, highway, the LSTMs' input and recurrent matmuls, the projection, the
  language model's softmax) in bfloat16 with float32 accumulation; weights converted once when the model is built or
  loaded; the cell state, gates, clipping, the scalar mix and every output in float32.
- `"auto"`: bfloat16 where the CPU multiplies bfloat16 natively (AVX512_BF16, which every AMX CPU also has), float32
  elsewhere (AVX2-only CPUs have no bfloat16 unit: there it is emulated and slower). Decided once per process.

The CPU is asked through the CPUID instruction (NumPy's `__cpu_features__`), not /proc/cpuinfo: under an emulated CPU
(`make test-avx2`, QEMU's user mode) /proc/cpuinfo still describes the host, while CPUID, which TensorFlow's and
oneDNN's kernel choice reads, answers as the emulated one. Standard library and NumPy only: no TensorFlow.
"""

import functools
import logging

from elmo_tf.errors import ElmoTFError

__all__ = ["PRECISIONS", "COMPUTED", "PrecisionError", "check_precision", "native_bfloat16", "resolve_precision"]

log = logging.getLogger(__name__)

PRECISIONS = ("float32", "bfloat16", "auto")  # what a user may ask for
COMPUTED = ("float32", "bfloat16")  # what a model computes in, once "auto" is resolved


class PrecisionError(ElmoTFError):
    """A precision that is not one of `PRECISIONS` (the message names the argument and the value)."""


def check_precision(value, name="precision", allowed=PRECISIONS):
    """`value` if it is one of `allowed`, else `PrecisionError` naming `name` and the value."""
    if not isinstance(value, str) or value not in allowed:
        raise PrecisionError(f"{name} must be one of {', '.join(allowed)}; got {value!r}", key=name)
    return value


@functools.cache
def native_bfloat16():
    """Whether this CPU multiplies bfloat16 natively: CPUID's AVX512_BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and
    later; AMX CPUs have it too). False where it cannot be told: float32 is never the wrong answer."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return False
    return bool(__cpu_features__.get("AVX512BF16", False))


@functools.cache
def _auto():
    chosen = "bfloat16" if native_bfloat16() else "float32"
    why = "multiplies bfloat16 natively" if chosen == "bfloat16" else "has no bfloat16 unit (no AVX512_BF16)"
    log.info("precision auto: %s (this CPU %s)", chosen, why)
    return chosen


def resolve_precision(value, name="precision"):
    """The precision to compute in, `"float32"` or `"bfloat16"`, for `value` (one of `PRECISIONS`; None is float32).
    `"auto"` is decided once per process (`native_bfloat16`) and logged once."""
    if value is None:
        return "float32"
    check_precision(value, name)
    return _auto() if value == "auto" else value
