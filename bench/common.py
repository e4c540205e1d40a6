"""The harness every benchmark script uses: flag parsing; the worker process (`run_measured`, `run_worker`,
`serve_worker`: one protocol, `SCRIPT --worker MODE --result PATH ...`, the worker's JSON back with its wall time,
peak RSS and CPU); random weights written once (`ensure_weights`); the matmul roofline (`matmul_roofline`, and the
`worker_matmul` mode that measures it in a fresh process); the fields of every result JSON (`result_fields`,
`write_result`); whether other processes shared the cores while a worker ran (`foreign_cpu_share`, `SharedCores`), and
the spread of repeated measurements (`spread`); padded batches and a model compiled as each Keras backend's users
compile one. Importing it loads neither TensorFlow nor Keras (bench/gpu_embed.py runs it where TensorFlow is not
installed)."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
CACHE = os.path.join(RESULTS, "cache")
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared"))  # ../shared: data and the peers
DEFAULT_PEER_PYTHON = "/tmp/allennlp-peer/bin/python"  # ../shared/peer/setup_allennlp.sh's default venv
DEFAULT_PEER_SCRIPT = os.path.join(SHARED, "peer", "allennlp_embed.py")
TREE_ENV = "ELMO_TF_BENCH_TREE"  # run_worker(pythonpath=...) sets it: the worker imports elmo_tf from that tree only
KIM_FILTERS = ((1, 25), (2, 50), (3, 75), (4, 100), (5, 125), (6, 150))
PTB_5M = dict(  # the 5.28M PTB model of bench/pretrain_ptb.py, trained by bench/train_throughput.py too
    char_embedding_dim=15,
    filters=KIM_FILTERS,
    num_highway=1,
    lstm_dim=384,
    projection_dim=192,
    num_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)


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


# ------------------------------------------------------------------------------------------------ worker processes

# Runs argv[2:] and writes "<wait status> <ru_maxrss KiB> <CPU seconds>" of it to argv[1]. Linux starts a child's
# ru_maxrss at the high-water RSS of the process that exec'd it (the exec'd-over memory counts: kernel/exit.c,
# fs/exec.c setmax_mm_hiwater_rss), so a child of a benchmark would report at least the benchmark's own peak (15 GB
# once the float16 comparison of bench/embed_resume.py had run, for every later run); a fresh launcher keeps that
# floor at its own ~10 MB.
_LAUNCHER = """import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{status} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
"""


class WorkerError(RuntimeError):
    """A worker process failed: its exit status and the tail of its stderr."""


def run_measured(command, cwd=REPO, backend=None, env=None, timeout=None):
    """Runs a subprocess (with `env` as its environment, else this one's; under `KERAS_BACKEND=backend` when given);
    returns (exit code, stdout, stderr, wall seconds, peak RSS MiB, CPU seconds). The peak RSS and CPU are the
    command's own, through a small launcher process (see `_LAUNCHER`). subprocess.TimeoutExpired past `timeout`."""
    env = dict(os.environ if env is None else env, **({"KERAS_BACKEND": backend} if backend else {}))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "usage")
        launcher = [sys.executable, "-S", "-c", _LAUNCHER, report, *map(str, command)]
        start = time.perf_counter()
        subprocess.run(launcher, cwd=cwd, stdout=out, stderr=err, check=True, env=env, timeout=timeout)
        wall = time.perf_counter() - start
        with open(report) as f:
            status, maxrss_kib, cpu = f.read().split()
        out.seek(0)
        err.seek(0)
        return (
            os.waitstatus_to_exitcode(int(status)),
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            wall,
            int(maxrss_kib) / 1024,
            float(cpu),
        )


def busy_cpu_seconds():
    """CPU seconds all processes of this machine have used since boot, over all CPUs (/proc/stat: user, nice, system,
    irq, softirq, and steal: time a hypervisor gave other machines while this one wanted it), or None where there is
    no /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def foreign_cpu_share(busy_before, busy_after, own_cpu_seconds, wall_seconds, cpus=None):
    """The share of this machine's CPU capacity over `wall_seconds` that went to anything but the measured process:
    `(busy CPU seconds of the machine - the process's own) / (wall x CPUs)`, at least 0; None where /proc/stat could
    not be read. Near 0 on a machine left alone (the launcher and this waiting process use a few milliseconds)."""
    if busy_before is None or busy_after is None or wall_seconds <= 0:
        return None
    foreign = busy_after - busy_before - own_cpu_seconds
    return max(0.0, foreign) / (wall_seconds * (cpus or os.cpu_count() or 1))


class SharedCores(RuntimeError):
    """Other processes used the cores while a measurement ran (its foreign CPU share), or the load average said so
    before it started: such a run is not recorded."""


def check_alone(what, share, limit):
    """`SharedCores` naming `what` when its `foreign_cpu_share` is over `limit` (None: unknown, passes)."""
    if share is not None and share > limit:
        raise SharedCores(
            f"{what}: other processes used {share:.0%} of the CPUs while it ran (limit {limit:.0%}): the cores were "
            "shared, so its speed is not this machine's; run the benchmark alone"
        )


def spread(values):
    """`{"median", "min", "max", "spread"}` of repeated measurements (positive numbers): `spread` is `(max - min) /
    median`, 0 for one value."""
    median, low, high = statistics.median(values), min(values), max(values)
    return {"median": median, "min": low, "max": high, "spread": (high - low) / median}


def run_watched(command, cwd=REPO, backend=None, env=None, timeout=None):
    """`run_measured` as a dict (`rc`, `stdout`, `stderr`, `wall`, `rss`, `cpu`) with the command's
    `foreign_cpu_share` (the machine's busy CPU time beside the command's own, from /proc/stat)."""
    before = busy_cpu_seconds()
    rc, out, err, wall, rss, cpu = run_measured(command, cwd, backend, env, timeout)
    share = foreign_cpu_share(before, busy_cpu_seconds(), cpu, wall)
    return {"rc": rc, "stdout": out, "stderr": err, "wall": wall, "rss": rss, "cpu": cpu, "foreign_cpu_share": share}


def run_worker(script, mode, options, work, python=None, backend=None, pythonpath=None, timeout=None):
    """Runs `python SCRIPT --worker MODE --result PATH *options` in its own process (under `KERAS_BACKEND=backend`;
    with `pythonpath` first on PYTHONPATH and as its directory, for another commit's tree) and returns the JSON the
    worker wrote to PATH (`serve_worker`), with the process's `process_seconds`, `peak_rss_mib`, `cpu_seconds`,
    `cpu_utilization` and `foreign_cpu_share` (`run_watched`). WorkerError naming the mode, with the tail of its
    stderr, when it fails."""
    result_path = os.path.join(work, f"{mode}-{time.monotonic_ns()}.json")
    command = [python or sys.executable, os.path.abspath(script), "--worker", mode, "--result", result_path, *options]
    env = dict(os.environ)
    env.pop(TREE_ENV, None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        env[TREE_ENV] = os.path.abspath(pythonpath)
    try:
        run = run_watched(command, pythonpath or REPO, backend, env, timeout)
    except subprocess.TimeoutExpired:
        raise WorkerError(f"worker {mode}: no result within {timeout} s") from None
    if run["rc"] != 0 or not os.path.isfile(result_path):
        raise WorkerError(f"worker {mode} failed with exit status {run['rc']}:\n{run['stderr'][-4000:]}")
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    wall, cpu = run["wall"], run["cpu"]
    result.update(process_seconds=wall, peak_rss_mib=run["rss"], cpu_seconds=cpu, cpu_utilization=cpu / wall)
    result["foreign_cpu_share"] = run["foreign_cpu_share"]
    return result


def only_this_tree():
    """Drops the editable install's import finder (pip install -e .: `__editable___elmo_tf_*_finder`) from this
    process, so a worker of another commit imports `elmo_tf` from that commit's tree only. Without this, a module
    that tree lacks (97bf9b2 has no `elmo_tf/pretraining/`) came from this checkout instead, and the "baseline" ran
    half of today's code."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]


def check_only_this_tree(tree):
    """RuntimeError naming any `elmo_tf` module this process imported from outside `tree`."""
    tree = os.path.join(os.path.realpath(tree), "")
    strays = sorted(
        name
        for name, module in list(sys.modules.items())
        if (name == "elmo_tf" or name.startswith("elmo_tf."))
        and getattr(module, "__file__", None)
        and not os.path.realpath(module.__file__).startswith(tree)
    )
    if strays:
        raise RuntimeError(f"the worker of {tree} imported elmo_tf modules from elsewhere: {', '.join(strays)}")


def add_worker_flags(parser, modes):
    """The worker side's hidden flags: `--worker MODE` (one of `modes`) and `--result PATH`."""
    parser.add_argument("--worker", choices=sorted(modes), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)


def serve_worker(workers, args):
    """The worker side of `run_worker`: runs `workers[args.worker](args)` and writes the dict it returns to
    `args.result` as JSON; returns the exit status (0)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tree = os.environ.get(TREE_ENV)
    if tree:
        only_this_tree()
    result = workers[args.worker](args)
    if tree:
        check_only_this_tree(tree)
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


def set_threads(threads):
    """TensorFlow's intra-op and inter-op pools at `threads` each (TF's default when 0 or None); returns `tf`."""
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


# ------------------------------------------------------------------------------------------------ weights

_WRITE_WEIGHTS = """import json, sys, keras
from elmo_tf.config import BiLMConfig, get_config
from elmo_tf.models import ELMo, save_elmo
keras.utils.set_random_seed(int(sys.argv[2]))
config = get_config(sys.argv[1]) if sys.argv[1] else BiLMConfig(**json.loads(sys.argv[3]))
save_elmo(ELMo(config), sys.argv[4])
"""


def ensure_weights(directory, preset=None, seed=0, config=None, python=None):
    """Random weights (seeded Keras initializers) of the BiLMConfig `preset`, or of `config` (a dict of BiLMConfig
    arguments), written once with `save_elmo` into `directory` in a subprocess (no TensorFlow here) and reused after;
    returns `(options.json path, weights.hdf5 path)`. RuntimeError with the writer's stderr when it fails."""
    options, weights = os.path.join(directory, "options.json"), os.path.join(directory, "weights.hdf5")
    if os.path.isfile(options) and os.path.isfile(weights):
        return options, weights
    arguments = [preset or "", str(seed), json.dumps(config or {}), directory]
    rc, _, err, *_ = run_measured([python or sys.executable, "-c", _WRITE_WEIGHTS, *arguments])
    if rc != 0:
        raise RuntimeError(f"writing random weights to {directory} failed ({rc}):\n{err[-4000:]}")
    return options, weights


# ------------------------------------------------------------------------------------------------ roofline

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


def model_flops(options, num_sampled=0):
    """Forward matmul FLOP (2 per multiply-add) per token position of a biLM given its options.json dict, by part:
    `char_cnn` (convolutions VALID over the chars, highway gate and transform, projection), `lstm` (one layer, both
    directions: `[x, h] W` + `m W_P`), `layers`, `softmax` (`num_sampled` + 1 logits, both directions)."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    chars, char_dim = cnn.get("max_characters_per_token", 50), cnn["embedding"]["dim"]
    n_filters = sum(n for _, n in cnn["filters"])
    units, proj = lstm["dim"], lstm["projection_dim"]
    char_cnn = sum(2 * (chars - w + 1) * w * char_dim * n for w, n in cnn["filters"])
    char_cnn += cnn.get("n_highway", 0) * 2 * (2 * n_filters * n_filters)
    char_cnn += 2 * n_filters * proj if n_filters != proj else 0
    return {
        "char_cnn": char_cnn,
        "lstm": 2 * (2 * (proj + proj) * 4 * units + 2 * units * proj),
        "layers": lstm["n_layers"],
        "softmax": 2 * 2 * (num_sampled + 1) * proj,
    }


def matmul_flops_per_position(options):
    """Matmul FLOP (2 per multiply-add) per token position of a biLM's forward pass, given its options.json dict."""
    part = model_flops(options)
    return part["char_cnn"] + part["layers"] * part["lstm"]


def count_parameters(options):
    """The parameters of a biLM given its options.json dict (char embedding, convolutions, highway, projection,
    LSTMs)."""
    lstm, cnn = options["lstm"], options["char_cnn"]
    filters = cnn["filters"]
    f = sum(n for _, n in filters)
    p, u = lstm["projection_dim"], lstm["dim"]
    n = cnn.get("n_characters", 262) * cnn["embedding"]["dim"]
    n += sum(w * cnn["embedding"]["dim"] * k + k for w, k in filters)
    n += cnn.get("n_highway", 0) * 2 * (f * f + f)
    n += (f * p + p) if f != p else 0
    n += 2 * lstm["n_layers"] * ((p + p) * 4 * u + 4 * u + u * p)
    return n


def worker_matmul(args):
    """The `matmul` worker mode: `matmul_roofline` with `args.threads` threads and `args.matmul_repeats` repeats,
    and in `args.matmul_precision` too where that is not float32 (under its name)."""
    set_threads(args.threads)
    repeats = getattr(args, "matmul_repeats", 5)
    result = dict(matmul_roofline(MATMUL_SIZES, repeats), threads=args.threads)
    precision = getattr(args, "matmul_precision", None) or "float32"
    if precision != "float32":
        result[precision] = matmul_roofline(MATMUL_SIZES, repeats, dtype=precision)
    return result


def matmul_sizes_text(matmul):
    """The best GFLOP/s of each size over the roofline measurements `matmul` (before, after): "1024^3 148/171; ..."."""
    sizes = matmul[0].get("sizes") or {}
    return "; ".join(f"{n}^3 " + "/".join(f"{m['sizes'][n]['best_gflops']:.0f}" for m in matmul) for n in sizes)


# ------------------------------------------------------------------------------------------------ result JSON


def provenance():
    """What a benchmark's JSON records about its run beside the commit: `{"date": "YYYY-MM-DD", "cpu": ...}` (the
    local date the run ended, `elmo_tf.machine.cpu_description()`)."""
    import time

    from elmo_tf.machine import cpu_description

    return {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_description()}


def result_fields(load_before=None, load_after=None, commit=None):
    """The fields every benchmark's result JSON carries beside its measurements: the commit (`git_commit`: read now,
    unless a long run read it before it started, as `commit`), the `date` and `cpu` that bench/tables.py record names
    the run by, the platform, the CPU count and, given the load averages before the run (`os.getloadavg()`), those
    before and after (now, unless given)."""
    fields = {"git_commit": commit or git_commit(REPO), **provenance(), "platform": platform.platform()}
    fields.update(processor=platform.processor(), cpu_count=os.cpu_count())
    if load_before is not None:
        fields.update(load_average_before=load_before, load_average_after=load_after or os.getloadavg())
    return fields


def write_result(path, result):
    """Writes a benchmark's `result` dict to `path` as indented JSON (its folder made) and says so on stdout."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------ data


def head_lines(path, n_lines, out):
    """Writes the first `n_lines` lines of `path` to `out` (bytes as they are); returns `out`."""
    with open(path, "rb") as src, open(out, "wb") as dst:
        for k, line in enumerate(src):
            if k >= n_lines:
                break
            dst.write(line)
    return out


# ------------------------------------------------------------------------------------------------ batches


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
