"""Embedding throughput of elmo_tf vs AllenNLP's PyTorch ELMo, side by side, interleaved and repeated in one run.

Spec: the original-size architecture (93.6M parameters, random weights), 1,000 natural-English sentences
(bench/sentences.py), batch 32 and 64, length-sorted and in corpus order, 2 threads: tokens/s, peak RSS, and achieved
GFLOP/s (204 MFLOP of matmul per position for the original shapes) as a fraction of this machine's float32 matmul
GFLOP/s measured by TF in the same run (the best of square matmuls of 1024, 2048 and 4096, best of several each,
before and after the embedding runs: on some machines 4096^3 runs at half the speed of 1024^3, and the roofline is the
best the matmul reaches). Every row, AllenNLP's too, says its share of that roofline.

What runs (the subjects of one repeat), for each batch size and order:
  - TensorFlow's Embedder (`ours`), once per --precision (float32 and/or bfloat16: `load_elmo(..., precision=)`,
    `Embedder(..., precision=)`);
  - AllenNLP (the peer: ../shared/peer/allennlp_embed.py, `--sort` for length-sorted batches, `--threads`), unless
    --skip-peer;
  - with --backend tensorflow,jax,torch: `ELMo` itself on each Keras backend, the README's way (`load_elmo` and the
    model's `activations`; `jax.jit` of `stateless_call` under JAX, `torch.no_grad()` under PyTorch, `tf.function` on
    TensorFlow), a padded sentence per row (`common.padded_batches`), once per --precision;
  - with --embedder-backend jax,torch: the Embedder itself on JAX and on PyTorch (`elmo_tf.embed.backend_functions`:
    the same packed rows and distinct tokens, the biLM `jax.jit`-compiled per padded shape), once per --precision.
Interleaved: --repeats rounds (3), each running every subject once, round r starting at subject r (rotated), so a
drift of the machine's speed falls on every subject alike; each ratio (ours / AllenNLP, a backend / AllenNLP, a
backend / the Embedder) is taken within a round and reported as its median, min and max over the rounds, with its
spread, (max - min) / median (the target: <= 10%).

Alone or not at all: a run is refused before it starts when the load average (1 min) is over --max-load (0.5), and
stopped, without writing --out, as soon as one measurement finds other processes using more than --max-foreign-share
(5%) of the CPUs beside it (from /proc/stat: the machine's busy CPU time minus the measured process's own). Other work
on the cores slows AllenNLP far more than ours (ratios of 3.4x and 5.1x measured beside other work against 1.9x alone):
a ratio measured so flatters us. --allow-shared measures anyway (a check that the script works) and writes nothing.

How each subject is measured (each in its own process, so all see the same machine state; peak RSS is the process's
`ru_maxrss`, model loading included):
  - ours: a worker (`--worker ours`, bench/embed_workers.py) that loads the model, plans packed batches as `python -m
    elmo_tf embed` does (`elmo_tf.embed.plan_batches`: `batch_size` rows, several short sentences per row, max 128 x
    batch positions per batch; sorted = by length within windows of 50 x batch sentences, corpus = file order with one
    batch of look-ahead), embeds one untimed warm-up batch (under JAX every batch: it compiles once per padded
    shape), empties the memo, then times `Embedder.embed_rows` over all sentences with `--layers all`, keeping the
    arrays in memory (hdf5 writing excluded); TF's and PyTorch's pools get --threads threads;
  - the peer excludes model loading, runs one untimed warm-up batch and reports tokens/s of the pass;
  - a backend (`--worker plain`): model loading and one warm-up pass excluded (JAX compiles once per padded shape);
  - GFLOP/s = tokens/s x matmul FLOP per position (char CNN, highway, projection, and per direction and layer
    `[x, h] W` + `m W_P`); only real tokens count, not the sentence boundaries or padding.
Two more rows at the largest batch, sorted, float32, once, with their speedups: `no memo` (the Embedder's memo of
recent token vectors off), `+cache` (a token cache, `dump-token-embeddings`: words seen twice in --cache-vocab-from).
Targets (issue 52): the Embedder >= 2.5x AllenNLP and >= 75% of the roofline, float32, at every batch and order; ELMo
itself under JAX and PyTorch >= 1.0x AllenNLP, under JAX >= 0.8x the Embedder; every ratio's spread <= 10%; peak RSS
at or below AllenNLP's.

usage: .venv/bin/python bench/embed_throughput.py [--batch-sizes 32,64] [--orders sorted,corpus] [--repeats 3]
       [--backend tensorflow,jax,torch] [--embedder-backend jax,torch] [--precision float32,bfloat16]
       [--n-sentences 1000] [--skip-peer] [--quick]
       [--out bench/results/embed_throughput.json]
"""

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile

from common import (
    CACHE,
    DEFAULT_PEER_PYTHON,
    DEFAULT_PEER_SCRIPT,
    RESULTS,
    SHARED,
    SharedCores,
    add_worker_flags,
    check_alone,
    count_parameters,
    ensure_weights,
    matmul_flops_per_position,
    matmul_sizes_text,
    parse_list,
    result_fields,
    run_worker,
    serve_worker,
    spread,
    write_result,
)
from embed_workers import WORKERS, run_peer
from sentences import load_sentences, write_sentences

DEFAULT_OUT = os.path.join(RESULTS, "embed_throughput.json")
ORDERS = ("sorted", "corpus")
BACKENDS = ("tensorflow", "jax", "torch")
EMBEDDER_BACKENDS = ("jax", "torch")
EMBEDDER = "embedder"  # the subject "jax embedder": the Embedder on JAX (--embedder-backend)
PRECISIONS = ("float32", "bfloat16")
DEFAULT_CACHE_VOCAB_FROM = ",".join(
    os.path.join(SHARED, "data", "pretrain", name) for name in ("wikipedia_en_2015.txt", "wikitext2_train.txt")
)
TARGET_RATIO = 2.5  # the Embedder / AllenNLP, float32
TARGET_ROOFLINE = 0.75  # the Embedder's share of the float32 roofline
TARGET_BACKEND_RATIO = 1.0  # ELMo itself on JAX and on PyTorch / AllenNLP
TARGET_JAX_VS_EMBEDDER = 0.8
TARGET_SPREAD = 0.10  # (max - min) / median of every ratio over the rounds
DASH = "-"
log = logging.getLogger("embed_throughput")


def run_embed_worker(args, mode, extra, work, backend=None):
    """`common.run_worker` of this script's worker `mode` with the flags every mode reads."""
    options = ["--threads", str(args.threads), "--weights-dir", args.weights_dir, *extra]
    return run_worker(__file__, mode, options, work, python=args.python, backend=backend)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (32,64)")
    parser.add_argument("--orders", default=None, help="comma-separated orders: sorted, corpus (sorted,corpus)")
    parser.add_argument("--n-sentences", type=int, default=None, help="sentences (1000)")
    parser.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every tool and of the matmul (2)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds of every subject (3)")
    parser.add_argument(
        "--matmul-repeats", type=int, default=5, help="timed matmuls per size (1024, 2048, 4096), best counts (5)"
    )
    parser.add_argument("--no-cache", action="store_true", help="leave out the no memo and +cache rows")
    parser.add_argument(
        "--cache-vocab-from",
        default=DEFAULT_CACHE_VOCAB_FROM,
        help="comma-separated text files whose words seen twice or more make the +cache row's vocabulary",
    )
    parser.add_argument("--skip-peer", action="store_true", help="run ours only")
    parser.add_argument(
        "--backend",
        default=None,
        help="comma-separated Keras backends (tensorflow, jax, torch) whose `ELMo` also runs, the README's way (a "
        "padded sentence per row): one row per backend, precision, batch and order",
    )
    parser.add_argument(
        "--embedder-backend",
        default=None,
        help="comma-separated Keras backends (jax, torch) on which the Embedder also runs (packed rows, as on "
        "TensorFlow): one row per backend, precision, batch and order",
    )
    parser.add_argument(
        "--precision", default="float32", help="comma-separated precisions of ours and the backends: float32, bfloat16"
    )
    parser.add_argument("--max-load", type=float, default=0.5, help="refuse to start above this load average (0.5)")
    parser.add_argument(
        "--max-foreign-share",
        type=float,
        default=0.05,
        help="stop when other processes used more than this share of the CPUs during a measurement (0.05)",
    )
    parser.add_argument(
        "--allow-shared", action="store_true", help="measure on shared cores anyway (checks the script; writes nothing)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100 sentences, batch 32, sorted, 1 round (explicit flags win)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--preset", default="original", help="BiLMConfig preset of the random model (original)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    parser.add_argument("--weights-dir", default=None, help="the random weights' cache (bench/results/cache/...)")
    parser.add_argument("--python", default=sys.executable, help="python with elmo_tf installed (this one)")
    parser.add_argument(
        "--peer-python", default=DEFAULT_PEER_PYTHON, help=f"python of the AllenNLP venv ({DEFAULT_PEER_PYTHON})"
    )
    parser.add_argument("--peer-script", default=DEFAULT_PEER_SCRIPT, help="the peer's embed script")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results (bench/results/embed_throughput.json)")
    add_worker_flags(parser, WORKERS)
    for hidden in ("--input", "--order", "--cache-file", "--cache-vocab", "--matmul-precision"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memo-size", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def settings(args):
    """`(batch sizes, orders, backends, precisions)` of the flags; ValueError naming the flag when one is bad."""
    try:
        batch_sizes = parse_list(args.batch_sizes or ("32" if args.quick else "32,64"), int, "--batch-sizes")
        orders = parse_list(args.orders or ("sorted" if args.quick else "sorted,corpus"), str, "--orders")
        backends = parse_list(args.backend, str, "--backend") if args.backend else []
        embedder_backends = (
            parse_list(args.embedder_backend, str, "--embedder-backend") if args.embedder_backend else []
        )
        precisions = parse_list(args.precision, str, "--precision")
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    if any(b not in BACKENDS for b in backends):
        raise ValueError(f"--backend takes {', '.join(BACKENDS)}, got {args.backend!r}")
    if any(b not in EMBEDDER_BACKENDS for b in embedder_backends):
        raise ValueError(f"--embedder-backend takes {', '.join(EMBEDDER_BACKENDS)}, got {args.embedder_backend!r}")
    backends += [f"{b} {EMBEDDER}" for b in embedder_backends]
    if any(p not in PRECISIONS for p in precisions) or len(set(precisions)) != len(precisions):
        raise ValueError(f"--precision takes {', '.join(PRECISIONS)} (each once), got {args.precision!r}")
    if any(b < 1 for b in batch_sizes) or any(o not in ORDERS for o in orders):
        raise ValueError(f"batch sizes must be >= 1 and orders in {ORDERS}, got {batch_sizes} {orders}")
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if not args.skip_peer:
        for path, flag in ((args.peer_python, "--peer-python"), (args.peer_script, "--peer-script")):
            if not os.path.isfile(path):
                setup = "run ../shared/peer/setup_allennlp.sh, or pass --skip-peer"
                raise ValueError(f"{flag}: no such file: {path!r} ({setup})")
    return batch_sizes, orders, backends, precisions


def subjects_of(skip_peer, backends, precisions):
    """What one round measures, in the order of the first round: `(subject, precision)` for the Embedder ("ours") in
    each precision, the peer (None), each backend in each precision (a backend "jax", ELMo itself, or "jax embedder",
    the Embedder on JAX)."""
    subjects = [("ours", p) for p in precisions] + ([] if skip_peer else [("peer", None)])
    return subjects + [(b, p) for b in backends for p in precisions]


def rounds(subjects, repeats):
    """The subjects of each round: round r starts at subject r (rotated), so each subject takes each place in turn."""
    return [subjects[r % len(subjects) :] + subjects[: r % len(subjects)] for r in range(repeats)]


def measure_one(args, input_path, batch_size, order, subject, precision, work):
    """One subject's measurement (its worker's or the peer's dict, with its `foreign_cpu_share`)."""
    if subject == "peer":
        return run_peer(args, input_path, batch_size, order, work)
    extra = ["--input", input_path, "--batch-size", str(batch_size), "--order", order]
    if precision != "float32":  # (float32 passes no flag: the harness also runs a tree from before the setting)
        extra += ["--precision", precision]
    if subject == "ours":
        return run_embed_worker(args, "ours", extra, work)
    backend, _, path = subject.partition(" ")
    return run_embed_worker(args, "ours" if path == EMBEDDER else "plain", extra, work, backend=backend)


def checked(args, what, result, shared):
    """`result`, after `common.check_alone` (which raises `SharedCores`, unless --allow-shared: then `shared` lists
    what was measured beside other work)."""
    try:
        check_alone(what, result.get("foreign_cpu_share"), args.max_foreign_share)
    except SharedCores:
        if not args.allow_shared:
            raise
        shared.append(f"{what}: {result['foreign_cpu_share']:.0%} of the CPUs")
    return result


def measure_rounds(args, input_path, configs, subjects, work, shared):
    """Every round of every (batch size, order): `runs` in the JSON's layout, one per round and Embedder precision
    (`ours`, `peer`, `ratio`) and per round, backend and precision (`variant`, `ours`, `peer`)."""
    runs = []
    for batch_size, order in configs:
        for repeat, subjects_in_round in enumerate(rounds(subjects, args.repeats)):
            got = {}
            for subject, precision in subjects_in_round:
                what = f"{subject} {precision or ''} batch {batch_size} {order} round {repeat}".replace("  ", " ")
                got[subject, precision] = checked(
                    args, what, measure_one(args, input_path, batch_size, order, subject, precision, work), shared
                )
                log.info("%s: %.0f tokens/s", what, got[subject, precision]["tokens_per_s"])
            runs += paired(batch_size, order, repeat, got)
    return runs


def paired(batch_size, order, repeat, got):
    """The runs of one round: each measurement with the peer's of the same round, and a backend's with the Embedder's
    of its precision."""
    peer = got.get(("peer", None))
    runs = []
    for (subject, precision), result in got.items():
        if subject == "peer":
            continue
        run = {"batch_size": batch_size, "order": order, "repeat": repeat, "precision": precision, "ours": result}
        if subject != "ours":
            run["variant"] = subject if precision == "float32" else f"{subject} {precision}"
            embedder = got.get(("ours", precision))
            if embedder:
                run["ratio_vs_embedder"] = result["tokens_per_s"] / embedder["tokens_per_s"]
        elif precision != "float32":
            run["variant"] = precision
        if peer:
            run["peer"] = peer
            run["ratio"] = result["tokens_per_s"] / peer["tokens_per_s"]
        runs.append(run)
    return runs


def measure_variants(args, input_path, batch_size, work, shared):
    """Ours at `batch_size`, sorted, float32, with the memo off and with a token-embedding cache (built once)."""
    cache_file = os.path.join(args.weights_dir, "token_embeddings.hdf5")
    cache_vocab = os.path.join(args.weights_dir, "token_embeddings_vocab.txt")
    cache = ["--cache-file", cache_file, "--cache-vocab", cache_vocab]
    if not (os.path.isfile(cache_file) and os.path.isfile(cache_vocab)):
        log.info("dumping token embeddings for the words of %s", args.cache_vocab_from)
        run_embed_worker(args, "cache", cache + ["--cache-vocab-from", args.cache_vocab_from], work)
    extra = ["--input", input_path, "--batch-size", str(batch_size), "--order", "sorted"]
    runs = []
    for variant, options, more in (("no memo", ["--memo-size", "0"], {}), ("+cache", cache, {"cache": True})):
        run = {"batch_size": batch_size, "order": "sorted", "repeat": 0, "precision": "float32", **more}
        run.update(variant=variant, ours=run_embed_worker(args, "ours", extra + options, work))
        checked(args, f"ours {variant}", run["ours"], shared)
        log.info("ours  batch %d sorted, %s: %.0f tokens/s", batch_size, variant, run["ours"]["tokens_per_s"])
        runs.append(run)
    return runs


def measure(args, sentences, configs, subjects, shared):
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
        if any(p == "bfloat16" for _, p in subjects):
            repeats += ["--matmul-precision", "bfloat16"]
        matmul = [checked(args, "matmul", run_embed_worker(args, "matmul", repeats, work), shared)]
        log.info("matmul, %d threads: %s GFLOP/s", args.threads, matmul_sizes_text(matmul))
        runs = measure_rounds(args, input_path, configs, subjects, work, shared)
        if not args.no_cache:
            runs += measure_variants(args, input_path, max(b for b, _ in configs), work, shared)
        matmul.append(checked(args, "matmul", run_embed_worker(args, "matmul", repeats, work), shared))
        return options, matmul, runs
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ report


def derive(runs, fpp, rooflines):
    """Adds GFLOP/s and the share of the roofline of its precision (float32's too) to every measurement of `runs`,
    the peer's included, and the speedups of the no memo and +cache rows."""
    for run in runs:
        for who in ("ours", "peer"):
            if who in run:
                m = run[who]
                m["gflops"] = m["tokens_per_s"] * fpp / 1e9
                precision = run.get("precision", "float32") if who == "ours" else "float32"
                m["fraction_of_roofline"] = m["gflops"] / rooflines[precision]
                m["fraction_of_float32_roofline"] = m["gflops"] / rooflines["float32"]
                if "sentences" in m:
                    boundaries = m["tokens"] + 2 * m["sentences"]
                    m["gflops_with_boundaries"] = boundaries / m["seconds"] * fpp / 1e9
        if run.get("variant") in ("no memo", "+cache"):
            key = (run["batch_size"], "sorted", "float32", 0)
            same = {
                r.get("variant"): r["ours"]["tokens_per_s"]
                for r in runs
                if (r["batch_size"], r["order"], r.get("precision"), r["repeat"]) == key
            }
            if None in same:
                run["speedup_vs_default"] = run["ours"]["tokens_per_s"] / same[None]
            if run.get("cache") and "no memo" in same:
                run["speedup_vs_no_memo"] = run["ours"]["tokens_per_s"] / same["no memo"]


def summarize(runs):
    """One row per (batch size, order, variant) over its rounds: the median, min and max of tokens/s, of each ratio
    (`common.spread`: with its spread), of the share of the roofline, and the largest peak RSS."""
    groups = {}
    for run in runs:
        groups.setdefault((run["batch_size"], run["order"], run.get("variant")), []).append(run)
    summary = []
    for (batch_size, order, variant), group in groups.items():
        row = {"batch_size": batch_size, "order": order, "variant": variant, "rounds": len(group)}
        row["precision"] = group[0].get("precision", "float32")
        row["tokens_per_s"] = spread([r["ours"]["tokens_per_s"] for r in group])
        row["fraction_of_roofline"] = spread([r["ours"]["fraction_of_roofline"] for r in group])
        row["peak_rss_mib"] = max(r["ours"]["peak_rss_mib"] for r in group)
        if all("peer" in r for r in group):
            row["peer_tokens_per_s"] = spread([r["peer"]["tokens_per_s"] for r in group])
            row["peer_fraction_of_roofline"] = spread([r["peer"]["fraction_of_roofline"] for r in group])
            row["peer_peak_rss_mib"] = max(r["peer"]["peak_rss_mib"] for r in group)
        for key in ("ratio", "ratio_vs_embedder", "speedup_vs_default"):
            if all(key in r for r in group):
                row[key] = spread([r[key] for r in group])
        summary.append(row)
    return summary


def targets_missed(summary):
    """The issue's targets each summary row misses (see the module docstring), as sentences."""
    missed = []
    for row in summary:
        where = f"batch {row['batch_size']} {row['order']}" + (f" {row['variant']}" if row["variant"] else "")
        backend = (row["variant"] or "").split(" ")[0]
        if row["variant"] in (None, "bfloat16"):
            if row["variant"] is None and row.get("ratio") and row["ratio"]["median"] < TARGET_RATIO:
                missed.append(f"{where}: {row['ratio']['median']:.2f}x AllenNLP < {TARGET_RATIO}x")
            if row["variant"] is None and row["fraction_of_roofline"]["median"] < TARGET_ROOFLINE:
                missed.append(f"{where}: {row['fraction_of_roofline']['median']:.0%} of the roofline "
                              f"< {TARGET_ROOFLINE:.0%}")  # fmt: skip
            if row.get("peer_peak_rss_mib") and row["peak_rss_mib"] > row["peer_peak_rss_mib"]:
                missed.append(f"{where}: peak RSS {row['peak_rss_mib']:.0f} MiB > AllenNLP's "
                              f"{row['peer_peak_rss_mib']:.0f}")  # fmt: skip
        if backend in ("jax", "torch") and row.get("ratio") and row["ratio"]["median"] < TARGET_BACKEND_RATIO:
            missed.append(f"{where}: {row['ratio']['median']:.2f}x AllenNLP < {TARGET_BACKEND_RATIO}x")
        if backend == "jax" and row.get("ratio_vs_embedder"):
            if row["ratio_vs_embedder"]["median"] < TARGET_JAX_VS_EMBEDDER:
                missed.append(f"{where}: {row['ratio_vs_embedder']['median']:.2f}x the Embedder "
                              f"< {TARGET_JAX_VS_EMBEDDER}x")  # fmt: skip
        for key in ("ratio", "ratio_vs_embedder"):
            if row.get(key) and row[key]["spread"] > TARGET_SPREAD:
                missed.append(f"{where}: {key} spread {row[key]['spread']:.0%} over {row['rounds']} rounds "
                              f"> {TARGET_SPREAD:.0%}")  # fmt: skip
    return missed


def _range(s, spec):
    """A spread as "median (min-max)"."""
    if s is None:
        return DASH
    if s["min"] == s["max"]:
        return format(s["median"], spec)
    return f"{format(s['median'], spec)} ({format(s['min'], spec)}-{format(s['max'], spec)})"


def print_report(args, report):
    """The printed table of `report`'s summary (medians over the rounds, min-max), the load, the targets."""
    print(
        f"\nELMo embed throughput, {args.preset} architecture ({report['parameters'] / 1e6:.1f}M parameters, "
        f"random weights), {report['n_sentences']} sentences / {report['n_tokens']} tokens, {args.threads} threads, "
        f"{report['repeats']} interleaved rounds: median (min-max)"
    )
    rooflines = ", ".join(f"{p} {g:.0f}" for p, g in report["rooflines_gflops"].items())
    print(f"roofline GFLOP/s (TF matmul, best of sizes): {rooflines} (before/after: "
          f"{matmul_sizes_text(report['matmul'])}); {report['matmul_flops_per_position'] / 1e6:.1f} MFLOP "
          "matmul per token")  # fmt: skip
    print(f"{'batch, order, what':<28} {'tok/s':>17} {'AllenNLP tok/s':>17} {'ratio':>19} {'vs Embedder':>19} "
          f"{'% roofline':>12} {'AllenNLP %':>11} {'RSS MiB':>8} {'AllenNLP':>8}")  # fmt: skip
    for row in report["summary"]:
        what = f"{row['batch_size']} {row['order']} " + (row["variant"] or "Embedder")
        peer_rss = row.get("peer_peak_rss_mib")
        print(
            f"{what:<28} {_range(row['tokens_per_s'], '.0f'):>17} {_range(row.get('peer_tokens_per_s'), '.0f'):>17} "
            f"{_range(row.get('ratio'), '.2f'):>19} {_range(row.get('ratio_vs_embedder'), '.2f'):>19} "
            f"{row['fraction_of_roofline']['median']:>12.0%} "
            f"{(format(row['peer_fraction_of_roofline']['median'], '.0%') if peer_rss else DASH):>11} "
            f"{row['peak_rss_mib']:>8.0f} {(format(peer_rss, '.0f') if peer_rss else DASH):>8}"
        )
    for row in report["summary"]:
        for key in ("ratio", "ratio_vs_embedder"):
            if row.get(key) and row["rounds"] > 1:
                print(f"spread of {key} ({row['batch_size']} {row['order']} {row['variant'] or 'Embedder'}): "
                      f"{row[key]['spread']:.1%}")  # fmt: skip
    shares = [m.get("foreign_cpu_share") for run in report["runs"] for m in (run["ours"], run.get("peer") or {})]
    known = [s for s in shares if s is not None]
    before, after = report["load_average_before"][0], report["load_average_after"][0]
    print(f"load average (1 min) before {before:.2f}, after {after:.2f}; {os.cpu_count()} CPUs; other processes' "
          f"share of the CPUs during a measurement: at most {max(known, default=0):.1%}")  # fmt: skip
    missed = report["targets"]["missed"]
    print("targets: " + ("met" if not missed else "missed: " + "; ".join(missed)))


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    if args.weights_dir is None:
        args.weights_dir = os.path.join(CACHE, f"{args.preset}-seed{args.seed}")
    if args.worker:
        return serve_worker(WORKERS, args)
    try:
        batch_sizes, orders, backends, precisions = settings(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.repeats = args.repeats or (1 if args.quick else 3)
    load_before = os.getloadavg()
    if load_before[0] > args.max_load and not args.allow_shared:
        print(f"error: load average {load_before[0]:.2f} > --max-load {args.max_load}: the cores are shared; "
              "run the benchmark alone (nothing measured)", file=sys.stderr)  # fmt: skip
        return 3
    sentences = load_sentences(args.n_sentences or (100 if args.quick else 1000), args.data)
    configs = [(b, o) for b in batch_sizes for o in orders]
    shared = [] if load_before[0] <= args.max_load else [f"load average {load_before[0]:.2f} before the run"]
    try:
        options, matmul, runs = measure(args, sentences, configs, subjects_of(args.skip_peer, backends, precisions),
                                        shared)  # fmt: skip
    except SharedCores as e:
        print(f"error: {e} (stopped; nothing written)", file=sys.stderr)
        return 3
    except (RuntimeError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fpp = matmul_flops_per_position(options)
    rooflines = {"float32": max(m["best_gflops"] for m in matmul)}  # the roofline of every row, of its precision too
    if "bfloat16" in precisions:
        rooflines["bfloat16"] = max(m["bfloat16"]["best_gflops"] for m in matmul)
    derive(runs, fpp, rooflines)
    summary = summarize(runs)
    report = {
        "preset": args.preset,
        "parameters": count_parameters(options),
        "seed": args.seed,
        "matmul_flops_per_position": fpp,
        "n_sentences": len(sentences),
        "n_tokens": sum(len(s.split()) for s in sentences),
        "data": args.data or "default (bench/sentences.py)",
        "threads": args.threads,
        "repeats": args.repeats,
        "precisions": precisions,
        "roofline_gflops": rooflines["float32"],
        "rooflines_gflops": rooflines,
        "matmul": matmul,
        "runs": runs,
        "summary": summary,
        "targets": {"missed": targets_missed(summary)},
        "cores_shared": shared,
        "quick": args.quick,
        **result_fields(load_before),  # git_commit, date, cpu (what bench/tables.py record names the run by), load
    }
    print_report(args, report)
    if shared:
        print("not recorded: measured beside other work (" + "; ".join(shared) + ")")
        return 0
    write_result(args.out, report)
    return 1 if args.check and report["targets"]["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
