"""Small helpers shared by the benchmark scripts (flag parsing, provenance, padded batches and a model compiled as
each Keras backend's users compile one). Importing it loads neither TensorFlow nor Keras (bench/gpu_embed.py runs it
where TensorFlow is not installed)."""

import argparse
import subprocess

import numpy as np


def parse_list(text, kind, name):
    """A comma-separated flag value as a list of `kind`; ArgumentTypeError naming the flag when bad or empty."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: cannot parse {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{name}: empty list")
    return values


def git_commit(repo):
    """The checked-out commit of `repo`, or None outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


MATMUL_SIZES = (1024, 2048, 4096)


def matmul_roofline(sizes=MATMUL_SIZES, repeats=5, dtype="float32"):
    """This process's matmul speed in `dtype` (float32 unless told): `{"sizes": {n: {"best_gflops",
    "median_gflops"}}, "best_gflops"}` over square matmuls of each size (best of `repeats` after a warm-up). The
    best over sizes is the roofline: on some machines 4096^3 runs at half the speed of 1024^3. Set TF's thread
    counts before calling."""
    import time

    import tensorflow as tf

    result = {}
    for n in sizes:
        a, b = (tf.cast(tf.random.normal([n, n]), dtype) for _ in range(2))
        matmul = tf.function(lambda a, b: tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32)))
        matmul(a, b).numpy()  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, b).numpy()
            times.append(time.perf_counter() - start)
        times.sort()
        result[n] = {"best_gflops": 2 * n**3 / times[0] / 1e9, "median_gflops": 2 * n**3 / times[len(times) // 2] / 1e9}
    return {"sizes": result, "repeats": repeats, "best_gflops": max(v["best_gflops"] for v in result.values())}


def provenance():
    """What a benchmark's JSON records about its run beside the commit: `{"date": "YYYY-MM-DD", "cpu": ...}` (the
    local date the run ended, `elmo_tf.machine.cpu_description()`)."""
    import time

    from elmo_tf.machine import cpu_description

    return {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_description()}


def padded_batches(mapping, sentences, batch_size, bucket, sort=True):
    """`(indices, char ids)` per batch of `batch_size` sentences of Python strings (by length when `sort`, else in
    order), mapped by `mapping` (`elmo_tf.preprocessing.char_rows.sentences_to_char_ids`) and padded to a multiple of
    `bucket` tokens: fewer shapes for `jax.jit` to compile."""
    from elmo_tf.preprocessing.char_rows import sentences_to_char_ids

    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i])) if sort else list(range(len(sentences)))
    batches = []
    for k in range(0, len(order), batch_size):
        batch = order[k : k + batch_size]
        ids = sentences_to_char_ids(mapping, [sentences[i] for i in batch])
        width = -(-ids.shape[1] // bucket) * bucket
        batches.append((batch, np.pad(ids, [(0, 0), (0, width - ids.shape[1]), (0, 0)])))
    return batches


def compiled_activations(model, device=None):
    """`run(char ids) -> list of NumPy activations` of an `ELMo`, compiled as the running Keras backend's users compile
    a model: `tf.function` on TensorFlow, `jax.jit` of `stateless_call` on JAX (one program per input shape), eager
    under `torch.no_grad()` on PyTorch, the ids moved to `device` (e.g. "cuda")."""
    import keras

    backend = keras.config.backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        frozen = [v.value for v in model.non_trainable_variables]
        compiled = jax.jit(lambda t, f, ids: model.stateless_call(t, f, ids)[0]["activations"])
        return lambda ids: [np.asarray(a) for a in compiled(trainable, frozen, ids)]
    if backend == "torch":
        import torch

        def run(ids):
            with torch.no_grad():
                return [a.cpu().numpy() for a in model(torch.from_numpy(ids).to(device))["activations"]]

        return run
    import tensorflow as tf

    compiled = tf.function(lambda ids: model(ids)["activations"], reduce_retracing=True)
    return lambda ids: [a.numpy() for a in compiled(ids)]
