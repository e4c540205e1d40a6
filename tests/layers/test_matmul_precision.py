"""`low_precision_matmul` and `rounds_to_nearest`: products rounded to the nearest bfloat16 on every CPU, whichever
kernel TensorFlow picks (oneDNN's rounds to nearest, Eigen's truncates)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers import matmul_precision
from elmo_tf.layers.matmul_precision import low_precision_matmul, round_to, rounds_to_nearest


def _bf16(x):
    """float64 -> the nearest bfloat16 (ties to even), as float64: the reference rounding, in NumPy."""
    bits = np.asarray(x, np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def _ulp(x):
    """One bfloat16 unit in the last place at |x| (8 significant bits)."""
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 1e-30))) - 7)


def _check_rounded(got, exact):
    """`got` is `exact` rounded to the nearest bfloat16, up to float32 summation order: within half a unit (plus
    float32's error) everywhere, equal in most places, and unbiased (truncation is off by up to a unit, one way)."""
    got = np.asarray(got, np.float64)
    error = got - exact
    assert np.all(np.abs(error) <= 0.5 * _ulp(exact) * (1 + 1e-3) + 1e-6 * np.abs(exact)), np.abs(error).max()
    assert np.mean(got == _bf16(exact)) > 0.95
    assert abs(float(np.mean(error / _ulp(exact)))) < 0.1


def _operands(seed, m=24, k=40, n=16):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(k, n)).astype(np.float32)


@pytest.mark.parametrize("path", ["chosen", "emulated"])
@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (False, True), (True, False), (True, True)])
def test_values_and_gradients_are_rounded_to_nearest(path, transpose_a, transpose_b):
    """Whatever path this CPU takes, and the float32 emulation itself: the product of the rounded operands,
    rounded; each gradient the product of the rounded upstream and the rounded other operand, rounded."""
    a, b = _operands(seed=1)
    a_in, b_in = (a.T if transpose_a else a), (b.T if transpose_b else b)
    upstream = np.random.default_rng(2).normal(size=(a.shape[0], b.shape[1])).astype(np.float32)
    ta, tb = tf.constant(a_in), tf.constant(b_in)
    with tf.GradientTape() as tape:
        tape.watch([ta, tb])
        if path == "chosen":
            out = low_precision_matmul(ta, tb, "bfloat16", transpose_a=transpose_a, transpose_b=transpose_b)
        else:
            out = matmul_precision._emulated_matmul(ta, tb, tf.bfloat16, transpose_a, transpose_b)
    da, db = tape.gradient(out, [ta, tb], output_gradients=tf.constant(upstream))
    ra, rb, g = _bf16(a), _bf16(b), _bf16(upstream)
    assert out.dtype == tf.float32
    _check_rounded(out.numpy(), ra @ rb)
    _check_rounded(da.numpy(), (g @ rb.T).T if transpose_a else g @ rb.T)
    _check_rounded(db.numpy(), (ra.T @ g).T if transpose_b else ra.T @ g)


def test_truncation_fails_the_check():
    """The check above tells truncation from rounding (else it would pass on a CPU that truncates)."""
    a, b = _operands(seed=3)
    exact = _bf16(a).astype(np.float64) @ _bf16(b)
    truncated = (exact.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    with pytest.raises(AssertionError):
        _check_rounded(truncated, exact)


def test_float32_and_none_are_plain_matmuls():
    a, b = _operands(seed=4)
    plain = tf.matmul(a, b).numpy()
    for dtype in (None, "float32"):
        np.testing.assert_array_equal(low_precision_matmul(a, b, dtype).numpy(), plain)
    assert rounds_to_nearest("float32")


def test_round_to_rounds_ties_to_even():
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, -(1 + 3 * 2**-9)], np.float32)
    np.testing.assert_array_equal(round_to(tf.constant(values), tf.bfloat16).numpy(), _bf16(values))
    assert _bf16(values).tolist() == [1.0, 1 + 2**-6, 1.0, -(1 + 2**-7)]


def test_the_probe_reports_what_tf_matmul_does_here():
    """`rounds_to_nearest` agrees with a larger bfloat16 matmul of TF's own on this machine."""
    a, b = _operands(seed=5)
    exact = _bf16(a) @ _bf16(b)
    native = tf.cast(tf.matmul(tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)), tf.float32).numpy()
    assert rounds_to_nearest("bfloat16") == bool(np.mean(native == _bf16(exact)) > 0.95)


def test_the_conv_probe_reports_what_tf_conv1d_does_here():
    """`conv_rounds_to_nearest` agrees with a larger bfloat16 convolution of TF's own on this machine (on x86 with AVX2
    only, oneDNN's convolution rounds to nearest while Eigen's matmul truncates: the two are asked apart)."""
    rng = np.random.default_rng(6)
    x, kernel = rng.normal(size=(4, 12, 8)).astype(np.float32), rng.normal(size=(3, 8, 16)).astype(np.float32)
    rx, rk = _bf16(x), _bf16(kernel)
    exact = np.stack([np.einsum("nwc,wcf->nf", rx[:, p : p + 3], rk) for p in range(10)], axis=1)
    native = tf.nn.conv1d(tf.cast(x, tf.bfloat16), tf.cast(kernel, tf.bfloat16), stride=1, padding="VALID")
    native = tf.cast(native, tf.float32).numpy()
    assert matmul_precision.conv_rounds_to_nearest("bfloat16") == bool(np.mean(native == _bf16(exact)) > 0.95)
    assert matmul_precision.conv_rounds_to_nearest("float32")


@pytest.mark.slow
def test_without_onednn_tf_truncates_and_the_emulation_runs():
    """TF_ENABLE_ONEDNN_OPTS=0 gives Eigen's bfloat16 matmul, the one AVX2-only CPUs run: it truncates (what issue 37
    found), the probe says so, and `low_precision_matmul` still rounds to nearest there."""
    script = """
import numpy as np, tensorflow as tf
from elmo_tf.layers.matmul_precision import low_precision_matmul, rounds_to_nearest
rng = np.random.default_rng(0)
a, b = rng.normal(size=(16, 32)).astype(np.float32), rng.normal(size=(32, 16)).astype(np.float32)
ra, rb = (tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy() for x in (a, b))
exact = ra.astype(np.float64) @ rb
native = tf.cast(tf.matmul(tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)), tf.float32).numpy()
ours = low_precision_matmul(a, b, "bfloat16").numpy()
print(rounds_to_nearest("bfloat16"), np.mean(np.abs(native) <= np.abs(exact)), np.mean(ours - exact) / np.std(exact))
"""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    nearest, toward_zero, bias = done.stdout.split()[-3:]
    assert nearest == "False"
    assert float(toward_zero) == 1.0  # every native product truncated toward zero
    assert abs(float(bias)) < 1e-3
