"""Small helpers shared by the benchmark scripts (flag parsing, provenance)."""

import argparse
import subprocess


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
