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
import re
import shutil
import sys
import tempfile

from common import (
    CACHE,
    REPO,
    RESULTS,
    add_worker_flags,
    ensure_weights,
    matmul_sizes_text,
    model_flops,
    parse_list,
    result_fields,
    run_measured,
    run_worker,
    serve_worker,
    write_result,
)
from embed_workers import WORKERS
from sentences import load_sentences, write_sentences

SHARED = os.path.normpath(os.path.join(REPO, "..", "shared"))
DEFAULT_PEER_PYTHON = "/tmp/allennlp-peer/bin/python"
DEFAULT_PEER_SCRIPT = os.path.join(SHARED, "peer", "allennlp_embed.py")
DEFAULT_OUT = os.path.join(RESULTS, "embed_throughput.json")
ORDERS = ("sorted", "corpus")
BACKENDS = ("tensorflow", "jax", "torch")
TARGET_RATIO = 2.0
TARGET_ROOFLINE = 0.5
TARGET_ROOFLINE_SORTED = 0.65
DEFAULT_CACHE_VOCAB_FROM = ",".join(
    os.path.join(SHARED, "data", "pretrain", name) for name in ("wikipedia_en_2015.txt", "wikitext2_train.txt")
)
PEER_LINE = re.compile(r"(\d+) tokens in ([0-9.]+) s: ([0-9.]+) tokens/s")

DASH = "-"
log = logging.getLogger("embed_throughput")


def matmul_flops_per_position(options):
    """Matmul FLOP (2 per multiply-add) per token position of a biLM given its options.json dict."""
    part = model_flops(options)
    return part["char_cnn"] + part["layers"] * part["lstm"]


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


# ------------------------------------------------------------------------------------------ main process


def run_embed_worker(args, mode, extra, work, backend=None):
    """`common.run_worker` of this script's worker `mode` with the flags every mode reads."""
    options = ["--threads", str(args.threads), "--weights-dir", args.weights_dir, *extra]
    return run_worker(__file__, mode, options, work, python=args.python, backend=backend)


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
    add_worker_flags(parser, WORKERS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--order", choices=ORDERS, help=argparse.SUPPRESS)
    parser.add_argument("--cache-file", help=argparse.SUPPRESS)
    parser.add_argument("--cache-vocab", help=argparse.SUPPRESS)
    parser.add_argument("--memo-size", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def settings(args):
    """`(batch sizes, orders, backends)` of the flags; ValueError naming the flag when one is bad."""
    try:
        batch_sizes = parse_list(args.batch_sizes or ("32" if args.quick else "32,64"), int, "--batch-sizes")
        orders = parse_list(args.orders or ("sorted" if args.quick else "sorted,corpus"), str, "--orders")
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    backends = parse_list(args.backend, str, "--backend") if args.backend else []
    if any(b not in BACKENDS for b in backends):
        raise ValueError(f"--backend takes {', '.join(BACKENDS)}, got {args.backend!r}")
    if any(b < 1 for b in batch_sizes) or any(o not in ORDERS for o in orders):
        raise ValueError(f"batch sizes must be >= 1 and orders in {ORDERS}, got {batch_sizes} {orders}")
    if not args.skip_peer:
        for path, flag in ((args.peer_python, "--peer-python"), (args.peer_script, "--peer-script")):
            if not os.path.isfile(path):
                setup = "run ../shared/peer/setup_allennlp.sh, or pass --skip-peer"
                raise ValueError(f"{flag}: no such file: {path!r} ({setup})")
    return batch_sizes, orders, backends


def measure_pairs(args, input_path, batch_sizes, orders, backends, work):
    """Ours then the peer for each batch size, order and repeat, then `ELMo` itself on each of `backends`."""
    runs = []
    for batch_size in batch_sizes:
        for order in orders:
            extra = ["--input", input_path, "--batch-size", str(batch_size), "--order", order]
            for repeat in range(args.repeats):
                run = {"batch_size": batch_size, "order": order, "repeat": repeat}
                run["ours"] = run_embed_worker(args, "ours", extra, work)
                log.info("ours  batch %d %s: %.0f tokens/s", batch_size, order, run["ours"]["tokens_per_s"])
                if not args.skip_peer:
                    run["peer"] = run_peer(args, input_path, batch_size, order, work)
                    log.info("peer  batch %d %s: %.0f tokens/s", batch_size, order, run["peer"]["tokens_per_s"])
                runs.append(run)
                for backend in backends:
                    plain = {"batch_size": batch_size, "order": order, "repeat": repeat, "variant": backend}
                    plain["ours"] = run_embed_worker(args, "plain", extra, work, backend=backend)
                    plain["ratio_vs_embedder"] = plain["ours"]["tokens_per_s"] / run["ours"]["tokens_per_s"]
                    tokens_per_s = plain["ours"]["tokens_per_s"]
                    log.info("%s plain batch %d %s: %.0f tokens/s", backend, batch_size, order, tokens_per_s)
                    runs.append(plain)
    return runs


def measure_variants(args, input_path, batch_size, work):
    """Ours at `batch_size`, sorted, with the memo off and with a token-embedding cache (built once)."""
    cache_file = os.path.join(args.weights_dir, "token_embeddings.hdf5")
    cache_vocab = os.path.join(args.weights_dir, "token_embeddings_vocab.txt")
    cache = ["--cache-file", cache_file, "--cache-vocab", cache_vocab]
    if not (os.path.isfile(cache_file) and os.path.isfile(cache_vocab)):
        log.info("dumping token embeddings for the words of %s", args.cache_vocab_from)
        run_embed_worker(args, "cache", cache + ["--cache-vocab-from", args.cache_vocab_from], work)
    extra = ["--input", input_path, "--batch-size", str(batch_size), "--order", "sorted"]
    runs = []
    for variant, options, more in (("no memo", ["--memo-size", "0"], {}), ("+cache", cache, {"cache": True})):
        run = {"batch_size": batch_size, "order": "sorted", "repeat": 0, **more, "variant": variant}
        run["ours"] = run_embed_worker(args, "ours", extra + options, work)
        log.info("ours  batch %d sorted, %s: %.0f tokens/s", batch_size, variant, run["ours"]["tokens_per_s"])
        runs.append(run)
    return runs


def derive(runs, fpp, roofline):
    """Adds GFLOP/s, the share of the roofline, the ratios and speedups to `runs`; returns the targets missed."""
    missed = []
    for run in runs:
        ours = run["ours"]
        ours["gflops"] = ours["tokens_per_s"] * fpp / 1e9
        ours["gflops_with_boundaries"] = (ours["tokens"] + 2 * ours["sentences"]) / ours["seconds"] * fpp / 1e9
        ours["fraction_of_roofline"] = ours["gflops"] / roofline
        if run.get("variant") in BACKENDS:
            continue
        if run.get("variant"):
            same = {r.get("variant"): r["ours"]["tokens_per_s"] for r in runs
                    if r["batch_size"] == run["batch_size"] and r["order"] == "sorted"}  # fmt: skip
            if None in same:
                run["speedup_vs_default"] = ours["tokens_per_s"] / same[None]
            if run.get("cache") and "no memo" in same:
                run["speedup_vs_no_memo"] = ours["tokens_per_s"] / same["no memo"]
            continue
        where = f"batch {run['batch_size']} {run['order']}"
        if "peer" in run:
            peer = run["peer"]
            peer["gflops"] = peer["tokens_per_s"] * fpp / 1e9
            run["ratio"] = ours["tokens_per_s"] / peer["tokens_per_s"]
            if run["ratio"] < TARGET_RATIO:
                missed.append(f"{where}: {run['ratio']:.2f}x AllenNLP < {TARGET_RATIO}x")
            if ours["peak_rss_mib"] > peer["peak_rss_mib"]:
                rss = f"peak RSS {ours['peak_rss_mib']:.0f} MiB > AllenNLP's {peer['peak_rss_mib']:.0f}"
                missed.append(f"{where}: {rss}")
        target = TARGET_ROOFLINE_SORTED if run["order"] == "sorted" else TARGET_ROOFLINE
        if ours["fraction_of_roofline"] < target:
            missed.append(f"{where}: {ours['fraction_of_roofline']:.0%} of roofline < {target:.0%}")
    return missed


def print_run(run, repeats):
    """One row of the printed table, and a line on a variant's or a backend's row."""
    ours, peer = run["ours"], run.get("peer")
    config = f"b{run['batch_size']} {run['order']}" + (f" {run['variant']}" if run.get("variant") else "")
    config += f" #{run['repeat']}" if repeats > 1 else ""
    peer_tps, ratio, peer_rss = (
        (f"{peer['tokens_per_s']:.0f}", f"{run['ratio']:.2f}", f"{peer['peak_rss_mib']:.0f}")
        if peer
        else (DASH, DASH, DASH)
    )
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
        print(f"{'':<16} {run['variant']}: {what}" + ", ".join(versus)
              + " (GFLOP/s counts the char-CNN work a memo or cache saves)")  # fmt: skip


def print_report(args, report):
    """The printed table of `report`: the roofline, one row per run, the load average, the targets."""
    print(
        f"\nELMo embed throughput, {args.preset} architecture ({report['parameters'] / 1e6:.1f}M parameters, "
        f"random weights), {report['n_sentences']} sentences / {report['n_tokens']} tokens, {args.threads} threads"
    )
    print(
        f"roofline: TF float32 matmul, best of sizes = {report['roofline_gflops']:.0f} GFLOP/s (before/after: "
        f"{matmul_sizes_text(report['matmul'])}); {report['matmul_flops_per_position'] / 1e6:.1f} MFLOP matmul per "
        "token"
    )
    print(
        f"{'config':<16} {'ours tok/s':>10} {'peer tok/s':>10} {'ratio':>6} {'ours GFLOP/s':>12} "
        f"{'% roofline':>10} {'ours RSS MiB':>12} {'peer RSS MiB':>12} {'row fill':>8}"
    )
    for run in report["runs"]:
        print_run(run, args.repeats)
    before, after = report["load_average_before"][0], report["load_average_after"][0]
    print(f"load average (1 min) before {before:.2f}, after {after:.2f}; {os.cpu_count()} CPUs")
    if max(before, after) > 0.5:
        print(
            "warning: the machine was not idle: other processes competed for the cores, so these numbers "
            "(and the ratio) are not those of an idle machine; rerun alone"
        )
    missed = report["targets"]["missed"]
    print(
        f"targets: >= {TARGET_RATIO}x AllenNLP, RSS <= AllenNLP's, >= {TARGET_ROOFLINE_SORTED:.0%} of roofline sorted "
        f"and >= {TARGET_ROOFLINE:.0%} in corpus order: " + ("met" if not missed else "missed: " + "; ".join(missed))
    )


def measure(args, sentences, batch_sizes, orders, backends):
    """Every run, between two roofline measurements: `(options, matmul, runs)`."""
    work = tempfile.mkdtemp(prefix="elmo_throughput_")
    try:
        input_path = write_sentences(sentences, os.path.join(work, "sentences.txt"))
        options_path, _ = ensure_weights(args.weights_dir, args.preset, args.seed, python=args.python)
        with open(options_path, encoding="utf-8") as f:
            options = json.load(f)
        log.info("%s: %.1fM parameters, %.1f MFLOP of matmul per position", args.preset,
                 count_parameters(options) / 1e6, matmul_flops_per_position(options) / 1e6)  # fmt: skip
        repeats = ["--matmul-repeats", str(args.matmul_repeats)]
        matmul = [run_embed_worker(args, "matmul", repeats, work)]
        log.info("matmul, %d threads: %s GFLOP/s (best of %d each)", args.threads, matmul_sizes_text(matmul),
                 args.matmul_repeats)  # fmt: skip
        runs = measure_pairs(args, input_path, batch_sizes, orders, backends, work)
        if not args.no_cache:
            runs += measure_variants(args, input_path, max(batch_sizes), work)
        matmul.append(run_embed_worker(args, "matmul", repeats, work))
        return options, matmul, runs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    if args.weights_dir is None:
        args.weights_dir = os.path.join(CACHE, f"{args.preset}-seed{args.seed}")
    if args.worker:
        return serve_worker(WORKERS, args)
    try:
        batch_sizes, orders, backends = settings(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sentences = load_sentences(args.n_sentences or (100 if args.quick else 1000), args.data)
    load_before = os.getloadavg()
    try:
        options, matmul, runs = measure(args, sentences, batch_sizes, orders, backends)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fpp = matmul_flops_per_position(options)
    roofline = max(m["best_gflops"] for m in matmul)
    missed = derive(runs, fpp, roofline)
    report = {
        "preset": args.preset,
        "parameters": count_parameters(options),
        "seed": args.seed,
        "matmul_flops_per_position": fpp,
        "n_sentences": len(sentences),
        "n_tokens": sum(len(s.split()) for s in sentences),
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
        **result_fields(load_before),  # git_commit, date, cpu (what bench/tables.py record names the run by), load
    }
    print_report(args, report)
    write_result(args.out, report)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
