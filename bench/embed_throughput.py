"""Embedding throughput of elmo_tf vs AllenNLP's PyTorch ELMo, side by side in one run.

Spec: the original-size architecture (93.6M parameters, random weights), 1,000 natural-English
sentences (bench/sentences.py), batch 32 and 64, length-sorted and in corpus order, 2 threads:
tokens/s, peak RSS, and achieved GFLOP/s (204 MFLOP of matmul per position for the original shapes)
as a fraction of this machine's float32 matmul GFLOP/s measured by TF in the same run (the best of square
matmuls of 1024, 2048 and 4096, best of several each, before and after the embedding runs: on some machines
4096^3 runs at half the speed of 1024^3, and the roofline is the best the matmul reaches).
Targets: at least 2x AllenNLP at the same batch size and order, at least 65% of the roofline length-sorted
and 50% in corpus order, peak RSS at or below AllenNLP's. Two more rows at the largest batch, sorted: `no memo`
(the Embedder's LRU memo of recent token vectors off: the char CNN runs once per distinct token of each batch)
and `+cache` (a token-embedding cache, `python -m elmo_tf dump-token-embeddings`, for a vocabulary built from
other text: --cache-vocab-from, default the Wikipedia and WikiText-2 parts of shared/data/pretrain, words seen
twice or more), with their speedups over the default and over `no memo`, and the share of tokens the cache held.

How it is measured:
  - random original-size weights are written once with `elmo_tf.models.save_elmo` (seeded) into
    --weights-dir (default bench/results/cache/original-seed<seed>/, about 375 MB) and reused;
  - every run is its own subprocess, ours then the peer for each (batch size, order), so both see the
    same machine state; peak RSS is the subprocess's `ru_maxrss` (from `os.wait4`), model loading included;
  - ours: a worker mode of this script (`--worker ours`) that loads the model, plans packed batches as
    `python -m elmo_tf embed` does (`elmo_tf.embed.plan_batches`: `batch_size` rows of 64 positions, several
    short sentences per row, max 128 x batch positions per batch; sorted = by length within windows of
    50 x batch sentences, corpus = file order with one batch of look-ahead), embeds one untimed warm-up batch
    (the first of the plan), then times `Embedder.embed_rows` over all sentences with `--layers all`, keeping
    the arrays in memory (hdf5 writing excluded). A batch of ours has as many rows as the peer's has
    sentences, so the per-step matmuls have the same width;
    TF's intra-op and inter-op pools both get --threads threads;
  - the peer: ../shared/peer/allennlp_embed.py (`--sort` for length-sorted batches, `--threads`),
    which excludes model loading, runs one untimed warm-up batch and reports tokens/s of the pass;
  - achieved GFLOP/s = tokens/s x matmul FLOP per position (computed from options.json: char CNN,
    highway, projection, and per direction and layer `[x, h] W` + `m W_P`); only real tokens are
    counted, not the two sentence-boundary positions or padding (`gflops_with_boundaries` in the JSON
    counts the boundaries too).

usage: .venv/bin/python bench/embed_throughput.py [--batch-sizes 32,64] [--orders sorted,corpus]
       [--n-sentences 1000] [--skip-peer] [--quick] [--out bench/results/embed_throughput.json]
Run it on an otherwise idle machine: both tools are pinned to the same thread count, but other load
changes the numbers (the JSON records the load average before and after).
"""

import argparse
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from common import (
    MATMUL_SIZES,
    compiled_activations,
    git_commit,
    matmul_roofline,
    padded_batches,
    parse_list,
    provenance,
)
from sentences import REPO, load_sentences, write_sentences

SHARED = os.path.normpath(os.path.join(REPO, "..", "shared"))
DEFAULT_PEER_PYTHON = "/tmp/allennlp-peer/bin/python"
DEFAULT_PEER_SCRIPT = os.path.join(SHARED, "peer", "allennlp_embed.py")
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "embed_throughput.json")
DEFAULT_CACHE = os.path.join(REPO, "bench", "results", "cache")
ORDERS = ("sorted", "corpus")
BACKENDS = ("tensorflow", "jax", "torch")
TARGET_RATIO = 2.0
TARGET_ROOFLINE = 0.5
TARGET_ROOFLINE_SORTED = 0.65
DEFAULT_CACHE_VOCAB_FROM = ",".join(
    os.path.join(SHARED, "data", "pretrain", name) for name in ("wikipedia_en_2015.txt", "wikitext2_train.txt")
)
PEER_LINE = re.compile(r"(\d+) tokens in ([0-9.]+) s: ([0-9.]+) tokens/s")

log = logging.getLogger("embed_throughput")


def matmul_flops_per_position(options):
    """Matmul FLOP (2 per multiply-add) per token position of a biLM given its options.json dict."""
    lstm, cnn = options["lstm"], options["char_cnn"]
    chars = cnn.get("max_characters_per_token", 50)
    char_dim = cnn["embedding"]["dim"]
    filters = cnn["filters"]
    n_filters = sum(n for _, n in filters)
    units, proj, layers = lstm["dim"], lstm["projection_dim"], lstm["n_layers"]
    flops = sum(2 * (chars - w + 1) * w * char_dim * n for w, n in filters)  # conv, VALID over the chars
    flops += cnn.get("n_highway", 0) * 2 * (2 * n_filters * n_filters)  # gate and transform
    if n_filters != proj:
        flops += 2 * n_filters * proj
    flops += 2 * layers * (2 * (proj + proj) * 4 * units + 2 * units * proj)  # directions x layers
    return flops


def count_parameters(options):
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


# ---------------------------------------------------------------------------------------------- workers


def _set_threads(threads):
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


def worker_weights(args):
    """Writes random original-size weights (seeded Keras initializers) with save_elmo."""
    import keras

    from elmo_tf.config import get_config
    from elmo_tf.models import save_elmo
    from elmo_tf.models.elmo import ELMo

    keras.utils.set_random_seed(args.seed)
    model = ELMo(get_config(args.preset))
    save_elmo(model, args.weights_dir)
    return {"parameters": int(sum(v.numpy().size for v in model.weights if "mix_" not in v.path))}


def worker_matmul(args):
    """Best and median float32 GFLOP/s of square matmuls (MATMUL_SIZES) with --threads threads; `best_gflops` is
    the best over all sizes."""
    _set_threads(args.threads)
    return dict(matmul_roofline(MATMUL_SIZES, args.matmul_repeats), threads=args.threads)


def worker_cache(args):
    """Builds the +cache row's token-embedding file: a vocabulary of the words seen at least twice in
    --cache-vocab-from (whitespace tokens), dumped with elmo_tf.io.token_embeddings."""
    _set_threads(args.threads)
    from collections import Counter

    from elmo_tf.io.token_embeddings import compute_token_embeddings, write_token_embeddings
    from elmo_tf.models import load_elmo

    counts = Counter()
    for path in args.cache_vocab_from.split(","):
        with open(path, "rb") as f:
            for line in f:
                counts.update(line.split())
    vocabulary = sorted((t for t, n in counts.items() if n >= 2), key=lambda t: (-counts[t], t))
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), os.path.join(args.weights_dir, "weights.hdf5"))
    start = time.perf_counter()
    embedding = compute_token_embeddings(model, vocabulary)
    seconds = time.perf_counter() - start
    with open(args.cache_vocab, "wb") as f:
        f.write(b"".join(t + b"\n" for t in vocabulary))
    write_token_embeddings(args.cache_file, embedding, vocabulary=vocabulary)
    return {"vocabulary": len(vocabulary), "dump_seconds": seconds}


def worker_ours(args):
    """Times elmo_tf's Embedder over the sentences: model loading and one warm-up batch excluded."""
    _set_threads(args.threads)
    from elmo_tf.embed import Embedder, limit_malloc_arenas, plan_batches

    limit_malloc_arenas()  # as `python -m elmo_tf embed` does
    from elmo_tf.io.sentences import iter_sentences
    from elmo_tf.models import load_elmo

    start = time.perf_counter()
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), os.path.join(args.weights_dir, "weights.hdf5"))
    token_embeddings = None
    if args.cache_file:
        from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary

        vocabulary = read_vocabulary(args.cache_vocab)
        token_embeddings = vocabulary, load_token_embeddings(args.cache_file, vocabulary)
    memo = {} if args.memo_size is None else {"memo_size": args.memo_size}
    embedder = Embedder(model, "all", token_embeddings=token_embeddings, **memo)
    token_embeddings_rows = set(token_embeddings[0]) if token_embeddings else set()
    load_seconds = time.perf_counter() - start
    sentences = [s.tokens for s in iter_sentences(args.input)]
    lengths = [len(s) for s in sentences]
    batches = plan_batches(lengths, args.batch_size, 128 * args.batch_size, sort=args.order == "sorted")
    start = time.perf_counter()
    embedder.embed_rows([[sentences[i] for i in row] for row in batches[0]])
    warmup_seconds = time.perf_counter() - start
    embedder.stats = dict.fromkeys(embedder.stats, 0)
    results = {}
    start = time.perf_counter()
    for batch in batches:
        order = [i for row in batch for i in row]
        for i, array in zip(order, embedder.embed_rows([[sentences[i] for i in row] for row in batch])):
            results[i] = array
    seconds = time.perf_counter() - start
    tokens = sum(lengths)
    if len(results) != sum(n > 0 for n in lengths):
        raise RuntimeError(f"embedded {len(results)} sentences, expected {sum(n > 0 for n in lengths)}")
    stats = embedder.stats
    return {
        "tokens": tokens,
        "sentences": len(results),
        "batches": len(batches),
        "rows": sum(len(b) for b in batches),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "load_seconds": load_seconds,
        "warmup_seconds": warmup_seconds,
        "position_fill": stats["positions"] / max(stats["padded_positions"], 1),
        "distinct_per_token": stats["distinct"] / max(stats["tokens"], 1),
        "cache_hit_rate": stats["cached"] / max(stats["distinct"], 1),
        "cached_token_share": (
            sum(t in token_embeddings_rows for s in sentences for t in s) / tokens if token_embeddings else 0.0
        ),
        "max_rss_mib_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


BUCKET = 8  # the plain worker pads each batch's length to a multiple of this: fewer shapes for JAX to compile


def worker_plain(args):
    """Times `ELMo` itself on the Keras backend of this process (`KERAS_BACKEND`): one padded sentence per row (no
    packing, no distinct-token encoding: the Embedder's are TensorFlow's), Python strings mapped in NumPy
    (`common.padded_batches`), compiled as each backend's users compile it (`common.compiled_activations`). Model
    loading and one warm-up pass excluded (JAX compiles once per padded shape: the warm-up pass runs every batch)."""
    import keras

    backend = keras.config.backend()
    if backend == "tensorflow":
        _set_threads(args.threads)
    elif backend == "torch":
        import torch

        torch.set_num_threads(args.threads)
    from elmo_tf.io.sentences import iter_sentences
    from elmo_tf.models import load_elmo

    start = time.perf_counter()
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), os.path.join(args.weights_dir, "weights.hdf5"))
    load_seconds = time.perf_counter() - start
    run = compiled_activations(model)
    sentences = [s.tokens for s in iter_sentences(args.input)]
    sort = args.order == "sorted"
    batches = [ids for _, ids in padded_batches(model.char_mapping, sentences, args.batch_size, BUCKET, sort)]
    start = time.perf_counter()
    for ids in batches if backend == "jax" else batches[:1]:
        run(ids)
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for ids in batches:
        run(ids)  # the arrays in memory, as ours keeps them
    seconds = time.perf_counter() - start
    tokens = sum(map(len, sentences))
    return {
        "backend": backend,
        "tokens": tokens,
        "sentences": len(sentences),
        "batches": len(batches),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "load_seconds": load_seconds,
        "warmup_seconds": warmup_seconds,
        "position_fill": tokens / sum(int(ids.shape[0] * ids.shape[1]) for ids in batches),
        "max_rss_mib_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


WORKERS = {
    "weights": worker_weights,
    "matmul": worker_matmul,
    "ours": worker_ours,
    "cache": worker_cache,
    "plain": worker_plain,
}


# ------------------------------------------------------------------------------------------ main process


# Runs argv[2:] and writes "<wait status> <ru_maxrss KiB> <CPU seconds>" of it to argv[1]. Linux starts a child's
# ru_maxrss at the high-water RSS of the process that exec'd it (the exec'd-over memory counts: kernel/exit.c,
# fs/exec.c setmax_mm_hiwater_rss), so a child of this script would report at least this script's own peak (15 GB
# once the float16 comparison of bench/embed_resume.py had run, for every later run); a fresh launcher keeps that
# floor at its own ~10 MB.
_LAUNCHER = """import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{status} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
"""


def run_measured(command, cwd=REPO, backend=None):
    """Runs a subprocess (under `KERAS_BACKEND=backend` when given); returns (exit code, stdout, stderr, wall seconds,
    peak RSS MiB, CPU seconds). The peak RSS and CPU are the command's own, through a small launcher process (see
    `_LAUNCHER`)."""
    env = dict(os.environ, **({"KERAS_BACKEND": backend} if backend else {}))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "usage")
        launcher = [sys.executable, "-S", "-c", _LAUNCHER, report, *map(str, command)]
        start = time.perf_counter()
        subprocess.run(launcher, cwd=cwd, stdout=out, stderr=err, check=True, env=env)
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


def run_worker(args, mode, extra, work, backend=None):
    result_path = os.path.join(work, f"{mode}-{time.monotonic_ns()}.json")
    command = [
        args.python,
        os.path.abspath(__file__),
        "--worker",
        mode,
        "--result",
        result_path,
        "--threads",
        str(args.threads),
        "--weights-dir",
        args.weights_dir,
    ] + extra
    rc, _, err, wall, rss, cpu = run_measured(command, backend=backend)
    if rc != 0 or not os.path.isfile(result_path):
        raise RuntimeError(f"worker {mode} failed with exit status {rc}:\n{err[-4000:]}")
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    result.update(process_seconds=wall, peak_rss_mib=rss, cpu_seconds=cpu, cpu_utilization=cpu / wall)
    return result


def run_peer(args, input_path, batch_size, order, work):
    output = os.path.join(work, "peer_out.hdf5")
    command = [
        args.peer_python,
        args.peer_script,
        "--options",
        os.path.join(args.weights_dir, "options.json"),
        "--weights",
        os.path.join(args.weights_dir, "weights.hdf5"),
        "--input",
        input_path,
        "--output",
        output,
        "--batch-size",
        str(batch_size),
        "--threads",
        str(args.threads),
    ]
    if order == "sorted":
        command.append("--sort")
    try:
        rc, _, err, wall, rss, cpu = run_measured(command)
    finally:
        if os.path.exists(output):
            os.remove(output)
    match = PEER_LINE.search(err)
    if rc != 0 or not match:
        raise RuntimeError(f"peer failed with exit status {rc}:\n{err[-4000:]}")
    tokens, seconds, _ = match.groups()
    return {
        "tokens": int(tokens),
        "seconds": float(seconds),
        "tokens_per_s": int(tokens) / float(seconds),
        "process_seconds": wall,
        "peak_rss_mib": rss,
        "cpu_seconds": cpu,
        "cpu_utilization": cpu / wall,
    }


def ensure_weights(args, work):
    options = os.path.join(args.weights_dir, "options.json")
    weights = os.path.join(args.weights_dir, "weights.hdf5")
    if os.path.isfile(options) and os.path.isfile(weights):
        log.info("reusing random %s weights in %s", args.preset, args.weights_dir)
    else:
        log.info("writing random %s weights (seed %d) to %s", args.preset, args.seed, args.weights_dir)
        run_worker(args, "weights", ["--preset", args.preset, "--seed", str(args.seed)], work)
    with open(options, encoding="utf-8") as f:
        return json.load(f)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (32,64)")
    parser.add_argument("--orders", default=None, help="comma-separated orders: sorted, corpus (sorted,corpus)")
    parser.add_argument("--n-sentences", type=int, default=None, help="sentences (1000)")
    parser.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    parser.add_argument("--threads", type=int, default=2, help="threads of both tools and of the matmul (2)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each tool per configuration (1)")
    parser.add_argument(
        "--matmul-repeats", type=int, default=5, help="timed matmuls per size (1024, 2048, 4096), best counts (5)"
    )
    parser.add_argument("--no-cache", action="store_true", help="leave out the +cache row")
    parser.add_argument(
        "--cache-vocab-from",
        default=DEFAULT_CACHE_VOCAB_FROM,
        help="comma-separated text files whose words seen twice or more make the +cache row's vocabulary",
    )
    parser.add_argument("--skip-peer", action="store_true", help="run ours only")
    parser.add_argument(
        "--backend",
        default=None,
        help="comma-separated Keras backends (tensorflow, jax, torch) whose `ELMo` also runs plain (a padded sentence "
        "per row), beside TensorFlow's Embedder: one row per backend, batch and order",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100 sentences, batch 32, sorted (explicit flags still win)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--preset", default="original", help="BiLMConfig preset of the random model (original)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    parser.add_argument(
        "--weights-dir",
        default=None,
        help="where the random weights are cached (bench/results/cache/<preset>-seed<seed>)",
    )
    parser.add_argument("--python", default=sys.executable, help="python with elmo_tf installed (this one)")
    parser.add_argument(
        "--peer-python", default=DEFAULT_PEER_PYTHON, help=f"python of the AllenNLP venv ({DEFAULT_PEER_PYTHON})"
    )
    parser.add_argument("--peer-script", default=DEFAULT_PEER_SCRIPT, help="the peer's embed script")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results (bench/results/embed_throughput.json)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--order", choices=ORDERS, help=argparse.SUPPRESS)
    parser.add_argument("--cache-file", help=argparse.SUPPRESS)
    parser.add_argument("--cache-vocab", help=argparse.SUPPRESS)
    parser.add_argument("--memo-size", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    if args.weights_dir is None:
        args.weights_dir = os.path.join(DEFAULT_CACHE, f"{args.preset}-seed{args.seed}")
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        result = WORKERS[args.worker](args)
        with open(args.result, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return 0

    try:
        batch_sizes = parse_list(args.batch_sizes or ("32" if args.quick else "32,64"), int, "--batch-sizes")
        orders = parse_list(args.orders or ("sorted" if args.quick else "sorted,corpus"), str, "--orders")
    except argparse.ArgumentTypeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    backends = parse_list(args.backend, str, "--backend") if args.backend else []
    if any(b not in BACKENDS for b in backends):
        print(f"error: --backend takes {', '.join(BACKENDS)}, got {args.backend!r}", file=sys.stderr)
        return 2
    if any(b < 1 for b in batch_sizes) or any(o not in ORDERS for o in orders):
        print(f"error: batch sizes must be >= 1 and orders in {ORDERS}, got {batch_sizes} {orders}", file=sys.stderr)
        return 2
    n_sentences = args.n_sentences or (100 if args.quick else 1000)
    if not args.skip_peer:
        for path, flag in ((args.peer_python, "--peer-python"), (args.peer_script, "--peer-script")):
            if not os.path.isfile(path):
                print(
                    f"error: {flag}: no such file: {path!r} (run ../shared/peer/setup_allennlp.sh, "
                    f"or pass --skip-peer)",
                    file=sys.stderr,
                )
                return 2

    sentences = load_sentences(n_sentences, args.data)
    n_tokens = sum(len(s.split()) for s in sentences)
    work = tempfile.mkdtemp(prefix="elmo_throughput_")
    input_path = write_sentences(sentences, os.path.join(work, "sentences.txt"))
    load_before = os.getloadavg()
    runs = []
    try:
        options = ensure_weights(args, work)
        fpp = matmul_flops_per_position(options)
        log.info(
            "%s: %.1fM parameters, %.1f MFLOP of matmul per position; %d sentences, %d tokens",
            args.preset,
            count_parameters(options) / 1e6,
            fpp / 1e6,
            len(sentences),
            n_tokens,
        )
        matmul = [run_worker(args, "matmul", ["--matmul-repeats", str(args.matmul_repeats)], work)]
        log.info(
            "matmul, %d threads: %s GFLOP/s (best of %d each)",
            args.threads,
            ", ".join(f"{n}^3 {v['best_gflops']:.0f}" for n, v in matmul[0]["sizes"].items()),
            args.matmul_repeats,
        )
        for batch_size in batch_sizes:
            for order in orders:
                for repeat in range(args.repeats):
                    run = {"batch_size": batch_size, "order": order, "repeat": repeat}
                    run["ours"] = run_worker(
                        args, "ours", ["--input", input_path, "--batch-size", str(batch_size), "--order", order], work
                    )
                    log.info("ours  batch %d %s: %.0f tokens/s", batch_size, order, run["ours"]["tokens_per_s"])
                    if not args.skip_peer:
                        run["peer"] = run_peer(args, input_path, batch_size, order, work)
                        log.info("peer  batch %d %s: %.0f tokens/s", batch_size, order, run["peer"]["tokens_per_s"])
                    runs.append(run)
                    for backend in backends:
                        plain = {"batch_size": batch_size, "order": order, "repeat": repeat, "variant": backend}
                        extra = ["--input", input_path, "--batch-size", str(batch_size), "--order", order]
                        plain["ours"] = run_worker(args, "plain", extra, work, backend=backend)
                        plain["ratio_vs_embedder"] = plain["ours"]["tokens_per_s"] / run["ours"]["tokens_per_s"]
                        log.info(
                            "%s plain batch %d %s: %.0f tokens/s",
                            backend,
                            batch_size,
                            order,
                            plain["ours"]["tokens_per_s"],
                        )
                        runs.append(plain)
        if not args.no_cache:
            cache_file = os.path.join(args.weights_dir, "token_embeddings.hdf5")
            cache_vocab = os.path.join(args.weights_dir, "token_embeddings_vocab.txt")
            if not (os.path.isfile(cache_file) and os.path.isfile(cache_vocab)):
                log.info("dumping token embeddings for the words of %s", args.cache_vocab_from)
                cache_args = ["--cache-file", cache_file, "--cache-vocab", cache_vocab]
                run_worker(args, "cache", cache_args + ["--cache-vocab-from", args.cache_vocab_from], work)
            batch_size = max(batch_sizes)
            run = {"batch_size": batch_size, "order": "sorted", "repeat": 0, "variant": "no memo"}
            run["ours"] = run_worker(
                args,
                "ours",
                ["--input", input_path, "--batch-size", str(batch_size), "--order", "sorted", "--memo-size", "0"],
                work,
            )
            log.info("ours  batch %d sorted, no memo: %.0f tokens/s", batch_size, run["ours"]["tokens_per_s"])
            runs.append(run)
            run = {"batch_size": batch_size, "order": "sorted", "repeat": 0, "cache": True, "variant": "+cache"}
            run["ours"] = run_worker(
                args,
                "ours",
                ["--input", input_path, "--batch-size", str(batch_size), "--order", "sorted"]
                + ["--cache-file", cache_file, "--cache-vocab", cache_vocab],
                work,
            )
            log.info("ours  batch %d sorted +cache: %.0f tokens/s", batch_size, run["ours"]["tokens_per_s"])
            runs.append(run)
        matmul.append(run_worker(args, "matmul", ["--matmul-repeats", str(args.matmul_repeats)], work))
    except (RuntimeError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)

    roofline = max(m["best_gflops"] for m in matmul)
    missed = []
    for run in runs:
        ours = run["ours"]
        ours["gflops"] = ours["tokens_per_s"] * fpp / 1e9
        ours["gflops_with_boundaries"] = (ours["tokens"] + 2 * ours["sentences"]) / ours["seconds"] * fpp / 1e9
        ours["fraction_of_roofline"] = ours["gflops"] / roofline
        if run.get("variant") in BACKENDS:
            continue
        if run.get("variant"):
            same = {
                r.get("variant"): r["ours"]["tokens_per_s"]
                for r in runs
                if r["batch_size"] == run["batch_size"] and r["order"] == "sorted"
            }
            if None in same:
                run["speedup_vs_default"] = ours["tokens_per_s"] / same[None]
            if run.get("cache") and "no memo" in same:
                run["speedup_vs_no_memo"] = ours["tokens_per_s"] / same["no memo"]
            continue
        if "peer" in run:
            run["peer"]["gflops"] = run["peer"]["tokens_per_s"] * fpp / 1e9
            run["ratio"] = ours["tokens_per_s"] / run["peer"]["tokens_per_s"]
            if run["ratio"] < TARGET_RATIO:
                missed.append(
                    f"batch {run['batch_size']} {run['order']}: {run['ratio']:.2f}x AllenNLP < {TARGET_RATIO}x"
                )
            if ours["peak_rss_mib"] > run["peer"]["peak_rss_mib"]:
                missed.append(
                    f"batch {run['batch_size']} {run['order']}: peak RSS {ours['peak_rss_mib']:.0f} MiB > "
                    f"AllenNLP's {run['peer']['peak_rss_mib']:.0f}"
                )
        target = TARGET_ROOFLINE_SORTED if run["order"] == "sorted" else TARGET_ROOFLINE
        if ours["fraction_of_roofline"] < target:
            missed.append(
                f"batch {run['batch_size']} {run['order']}: {ours['fraction_of_roofline']:.0%} of roofline "
                f"< {target:.0%}"
            )

    print(
        f"\nELMo embed throughput, {args.preset} architecture ({count_parameters(options) / 1e6:.1f}M parameters, "
        f"random weights), {len(sentences)} sentences / {n_tokens} tokens, {args.threads} threads"
    )
    sizes = "; ".join(
        f"{n}^3 " + "/".join(f"{m['sizes'][str(n)]['best_gflops']:.0f}" for m in matmul) for n in MATMUL_SIZES
    )
    print(
        f"roofline: TF float32 matmul, best of sizes = {roofline:.0f} GFLOP/s (before/after: {sizes}); "
        f"{fpp / 1e6:.1f} MFLOP matmul per token"
    )
    header = (
        f"{'config':<16} {'ours tok/s':>10} {'peer tok/s':>10} {'ratio':>6} {'ours GFLOP/s':>12} "
        f"{'% roofline':>10} {'ours RSS MiB':>12} {'peer RSS MiB':>12} {'row fill':>8}"
    )
    print(header)
    for run in runs:
        ours, peer = run["ours"], run.get("peer")
        config = f"b{run['batch_size']} {run['order']}" + (f" {run['variant']}" if run.get("variant") else "")
        config += f" #{run['repeat']}" if args.repeats > 1 else ""
        peer_tps = f"{peer['tokens_per_s']:.0f}" if peer else "-"
        ratio = f"{run['ratio']:.2f}" if peer else "-"
        peer_rss = f"{peer['peak_rss_mib']:.0f}" if peer else "-"
        print(
            f"{config:<16} {ours['tokens_per_s']:>10.0f} {peer_tps:>10} {ratio:>6} {ours['gflops']:>12.0f} "
            f"{ours['fraction_of_roofline']:>10.0%} {ours['peak_rss_mib']:>12.0f} {peer_rss:>12} "
            f"{ours['position_fill']:>8.0%}"
        )
        if run.get("variant") in BACKENDS:
            print(
                f"{'':<16} {run['variant']}: ELMo itself, a padded sentence per row: {run['ratio_vs_embedder']:.2f}x "
                f"TensorFlow's Embedder (packed rows, each distinct token encoded once)"
            )
        elif run.get("variant"):
            versus = [
                f"{run[key]:.2f}x {label}"
                for key, label in (("speedup_vs_default", "the default (memo on)"), ("speedup_vs_no_memo", "no memo"))
                if key in run
            ]
            what = f"{ours['cached_token_share']:.0%} of tokens in the cache's vocabulary; " if run.get("cache") else ""
            print(
                f"{'':<16} {run['variant']}: {what}"
                + ", ".join(versus)
                + " (GFLOP/s counts the char-CNN work a memo or cache saves)"
            )
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs")
    if max(load_before[0], load_after[0]) > 0.5:
        print(
            "warning: the machine was not idle: other processes competed for the cores, so these numbers "
            "(and the ratio) are not those of an idle machine; rerun alone"
        )
    print(
        f"targets: >= {TARGET_RATIO}x AllenNLP, RSS <= AllenNLP's, >= {TARGET_ROOFLINE_SORTED:.0%} of roofline sorted "
        f"and >= {TARGET_ROOFLINE:.0%} in corpus order: " + ("met" if not missed else "missed: " + "; ".join(missed))
    )

    report = {
        "preset": args.preset,
        "parameters": count_parameters(options),
        "seed": args.seed,
        "matmul_flops_per_position": fpp,
        "n_sentences": len(sentences),
        "n_tokens": n_tokens,
        "data": args.data or "default (bench/sentences.py)",
        "threads": args.threads,
        "roofline_gflops": roofline,
        "matmul": matmul,
        "runs": runs,
        "targets": {
            "ratio_vs_peer": TARGET_RATIO,
            "fraction_of_roofline_sorted": TARGET_ROOFLINE_SORTED,
            "fraction_of_roofline_corpus": TARGET_ROOFLINE,
            "rss_vs_peer": 1.0,
            "missed": missed,
        },
        "quick": args.quick,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "git_commit": git_commit(REPO),
        **provenance(),  # date, cpu: what bench/tables.py record names the run by
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
