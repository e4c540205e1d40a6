"""The training scan's hand-written backward pass (`fast_gradient_scan`) against TensorFlow's automatic
gradient of the plain scan (`projected_lstm_scan`)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers.backends.tensorflow_recurrence import fast_gradient_scan, projected_lstm_scan


def _problem(seed, steps=7, batch=5, dim=6, units=8, proj=4, num=2, lengths=(7, 3, 5, 1, 0), kernel_scale=1.0):
    rng = np.random.default_rng(seed)
    mask = np.arange(steps)[:, None] < np.array(lengths)[None, :]
    args = dict(
        inputs=[tf.constant(rng.normal(size=(steps, batch, dim)), tf.float32) for _ in range(num)],
        input_kernels=[tf.constant(kernel_scale * rng.normal(size=(4 * units, dim)), tf.float32) for _ in range(num)],
        biases=[tf.constant(rng.normal(size=(4 * units,)), tf.float32) for _ in range(num)],
        recurrent_kernels=[
            tf.constant(kernel_scale * rng.normal(size=(4 * units, proj)), tf.float32) for _ in range(num)
        ],
        projection_kernels=[tf.constant(kernel_scale * rng.normal(size=(proj, units)), tf.float32) for _ in range(num)],
        initial_c=[tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in range(num)],
        initial_h=[tf.constant(rng.normal(size=(batch, proj)), tf.float32) for _ in range(num)],
    )
    resets = [tf.constant(mask & (rng.random(mask.shape) < 0.25)) for _ in range(num)]
    weights = [
        [tf.constant(rng.normal(size=(steps, batch, proj)), tf.float32) for _ in range(num)],
        [tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in range(num)],
        [tf.constant(rng.normal(size=(batch, proj)), tf.float32) for _ in range(num)],
    ]
    return args, tf.constant(mask), resets, weights


def _value_and_grads(scan, args, mask, resets, weights, clips, **kwargs):
    sources = [t for name in sorted(args) for t in args[name]]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        outs, cs, hs = scan(mask=mask, resets=resets, cell_clip=clips[0], proj_clip=clips[1], **args, **kwargs)
        loss = sum(tf.reduce_sum(y * w) for group, ws in zip((outs, cs, hs), weights) for y, w in zip(group, ws))
    return [t.numpy() for t in outs + cs + hs], [g.numpy() for g in tape.gradient(loss, sources)]


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.3), (3.0, 3.0)])
@pytest.mark.parametrize("with_resets", [False, True])
def test_fast_gradient_equals_automatic_gradient(clips, with_resets):
    args, mask, resets, weights = _problem(seed=1)
    resets = resets if with_resets else None
    plain_values, plain_grads = _value_and_grads(projected_lstm_scan, args, mask, resets, weights, clips)
    fast_values, fast_grads = _value_and_grads(fast_gradient_scan, args, mask, resets, weights, clips)
    for plain, fast in zip(plain_values, fast_values):
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)  # the forget bias is added in another order
    for plain, fast in zip(plain_grads, fast_grads):
        scale = max(1.0, float(np.abs(plain).max()))
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5 * scale)


def test_clipping_changes_the_gradient():
    """The clips reach the gradient (else the clipped cases above would test nothing beyond the unclipped)."""
    args, mask, _, weights = _problem(seed=2)
    _, free = _value_and_grads(fast_gradient_scan, args, mask, None, weights, (None, None))
    _, clipped = _value_and_grads(fast_gradient_scan, args, mask, None, weights, (0.5, 0.3))
    assert max(float(np.abs(a - b).max()) for a, b in zip(free, clipped)) > 1e-2


def test_one_direction_in_a_compiled_function():
    args, mask, _, weights = _problem(seed=3, num=1)
    expected_values, expected_grads = _value_and_grads(projected_lstm_scan, args, mask, None, weights, (3.0, 3.0))
    compiled = tf.function(fast_gradient_scan)
    values, grads = _value_and_grads(compiled, args, mask, None, weights, (3.0, 3.0))
    for a, b in zip(expected_values + expected_grads, values + grads):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(a).max())))


@pytest.mark.parametrize("clips, with_resets", [((None, None), False), ((0.5, 0.3), True), ((3.0, 3.0), True)])
def test_bfloat16_matmuls_stay_within_bfloat16_rounding_of_float32(clips, with_resets):
    """`matmul_dtype="bfloat16"` rounds every product's operands and result to the nearest bfloat16 (8 significant
    bits) and runs the rest in float32: values and gradients within a few bfloat16 roundings of the float32 ones
    (relative to their scale), and not equal to them (the products really were rounded). Kernels of initialization
    scale: with unit-normal ones the gates saturate and the unclipped recurrence amplifies any rounding over the
    steps, float32's too. TF's own bfloat16 matmul truncates where oneDNN does not run it (AVX2-only CPUs): its
    one-signed errors put (0.5, 0.3) with resets 0.29 away (issue 37), which is why the scan rounds by itself there;
    `test_bfloat16_scan_where_tf_truncates` runs this test on that path on any CPU."""
    args, mask, resets, weights = _problem(
        seed=4, steps=9, batch=6, dim=16, units=24, proj=12, lengths=(9, 3, 5, 1, 0, 8), kernel_scale=0.25
    )
    resets = resets if with_resets else None
    exact_values, exact_grads = _value_and_grads(fast_gradient_scan, args, mask, resets, weights, clips)
    low_values, low_grads = _value_and_grads(
        fast_gradient_scan, args, mask, resets, weights, clips, matmul_dtype="bfloat16"
    )
    differences = []
    for exact, low in zip(exact_values + exact_grads, low_values + low_grads):
        assert low.dtype == np.float32
        scale = max(1.0, float(np.abs(exact).max()))
        np.testing.assert_allclose(low, exact, atol=3e-2 * scale)
        differences.append(float(np.abs(low - exact).max()) / scale)
    assert max(differences) > 1e-4


@pytest.mark.slow
def test_bfloat16_scan_where_tf_truncates():
    """With oneDNN off, TF's bfloat16 matmul is Eigen's, which truncates its products, as on CPUs without AVX-512:
    the bfloat16 test above holds there too, in a process of its own (the variable is read when TF loads)."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="3", ELMO_TF_TEST_FORK="0")
    test = f"{__file__}::test_bfloat16_matmuls_stay_within_bfloat16_rounding_of_float32"
    run = (  # the test, then whether TF's bfloat16 matmul rounded to nearest in that process
        "import sys, pytest\n"
        "status = pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', sys.argv[1]])\n"
        "from elmo_tf.layers.matmul_precision import rounds_to_nearest\n"
        "print('rounds to nearest:', rounds_to_nearest('bfloat16'))\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run([sys.executable, "-c", run, test], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "3 passed" in done.stdout, done.stdout[-1000:]
    assert done.stdout.splitlines()[-1] == "rounds to nearest: False", done.stdout[-1000:]  # the emulated path ran


def test_matmul_dtype_float32_named_is_exact():
    """`matmul_dtype="float32"` (what `TrainConfig.matmul_precision`'s default names) matches TF's automatic gradient
    of the plain scan as closely as the default does."""
    args, mask, _, weights = _problem(seed=5)
    plain = _value_and_grads(projected_lstm_scan, args, mask, None, weights, (3.0, 3.0))
    named = _value_and_grads(fast_gradient_scan, args, mask, None, weights, (3.0, 3.0), matmul_dtype="float32")
    for a, b in zip(plain[0] + plain[1], named[0] + named[1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(a).max())))


GATES_MEMORY_SCRIPT = """
import numpy as np
import tensorflow as tf
from elmo_tf.layers.backends.tensorflow_recurrence import projected_lstm_scan

def rss_mib():
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS")][0]

units, proj, rows = 4096, 16, 16  # a chunk of 8 steps has 8 * 16 * 16384 floats of gates: 8 MiB
rng = np.random.default_rng(0)
w = lambda *shape: tf.constant(rng.standard_normal(shape).astype(np.float32) * 0.1)
kx, b, kh, kp = w(4 * units, proj), w(4 * units), w(4 * units, proj), w(proj, units)

@tf.function(input_signature=[tf.TensorSpec([None, rows, proj])])
def run(x):
    mask = tf.ones(tf.shape(x)[:2], tf.bool)
    c0, h0 = tf.zeros([rows, units]), tf.zeros([rows, proj])
    return projected_lstm_scan([x], mask, [kx], [b], [kh], [kp], [c0], [h0], chunk=8)[0][0]

found = []
for steps in (16, 16, 320, 320):
    run(tf.constant(rng.standard_normal((steps, rows, proj)).astype(np.float32)))
    found.append(rss_mib())
print(found[1], found[3])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
@pytest.mark.slow
def test_chunked_gates_memory_does_not_grow_with_the_steps():
    """With `chunk`, the gates of one chunk at a time exist, whatever the number of steps: 320 steps need no more
    memory than 16 (the loop over chunks computed up to 10 chunks' gates ahead, +66 MiB here, before it ran one chunk
    at a time)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", GATES_MEMORY_SCRIPT], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    short, long = map(int, done.stdout.split()[-2:])
    assert long - short < 20, (short, long)
