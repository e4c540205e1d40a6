"""biLM training throughput: target tokens/s of forward + backward + update (sampled softmax), ours side by
side with an earlier commit in one run, as a ratio and as a fraction of TF's matmul roofline measured in the
same run; and a profile of one training step by part.

Settings (`--configs`):
  ptb5m     the 5.28M-parameter PTB model of bench/pretrain_ptb.py (Kim et al.'s small char CNN, 2 x LSTM
            384 / projection 192), trained as pretrain_ptb.py trains it: sentences up to 100 tokens,
            2,048 sampled negatives;
  small     the `small` preset (original char CNN, 2 x LSTM 1024 / 128), 8,192 negatives, 50 tokens;
  original  the original shapes (2 x LSTM 4096 / 512), 8,192 negatives, 50 tokens.
--num-sampled / --max-tokens override the per-setting values for all settings. --bucket-width W batches our
sentences in length buckets W tokens wide instead of our TrainConfig's default (10, as 97bf9b2's fixed width: 22%
of a PTB batch's positions padding); the baseline keeps its own pipeline.

How it is measured:
  - every (commit, config, replicas) runs in its own subprocess (a worker mode of this script): it builds
    `elmo_tf.pretraining.Trainer` as training/pretrain.py does (MirroredStrategy over 1 or 2 logical CPUs,
    Adagrad, clip 10, dropout 0.1) and drives its compiled train step on the trainer's own tf.data input,
    without checkpoints or logs;
  - --baseline REV (default 97bf9b2, the commit before this work): the worker runs with that commit's
    `elmo_tf` (extracted with `git archive` into a temporary directory) on the same data, batch and seed,
    right before ours for each setting, so the ratio compares neighbours in time; --rounds N repeats the pair
    and reports the median;
  - data: the first --lines lines of PTB train, vocabulary: PTB's 9,999 word types + 3 specials;
  - --warmup untimed steps (tracing, first allocations), then --steps timed steps; each step syncs on
    its loss. Targets = words + </S> per direction, as the training log counts them;
  - GFLOP/s: 3 x the forward matmul FLOP per target (char CNN, highway, projection, LSTMs, softmax logits of
    the sampled set in both directions); backward = 2 x forward. Work on padding is not counted;
  - roofline: TF float32 square matmuls of 1024, 2048 and 4096 in a worker before and after, the best of all.
--profile (ours only) times the parts of one step on one batch of median length: input pipeline, char CNN,
each LSTM layer (both directions; the hand-written backward pass and TF's automatic one), the sampled softmax
of both directions, the optimizer update, the whole step; each forward + backward, with GFLOP/s.

usage: .venv/bin/python bench/train_throughput.py --quick          # smoke run: a few steps per setting
       .venv/bin/python bench/train_throughput.py --profile        # full run, alone on the machine
       [--configs ptb5m,original] [--replicas 1] [--baseline 97bf9b2|none] [--rounds 1] [--out PATH]
Writes bench/results/train_throughput.json.
"""

import argparse
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bilm_trainer import DEFAULT_DATA, SETTINGS, flops_per_target, make_trainer
from common import (
    REPO,
    RESULTS,
    WorkerError,
    add_worker_flags,
    matmul_sizes_text,
    parse_list,
    result_fields,
    run_worker,
    serve_worker,
    worker_matmul,
    write_result,
)
from train_step_parts import profile_parts

DEFAULT_OUT = os.path.join(RESULTS, "train_throughput.json")
DEFAULT_BASELINE = "97bf9b2"  # bench/history.py's REFERENCE_BASELINE: runs against it are recorded as "vs_baseline"
log = logging.getLogger("train_throughput")


# ---------------------------------------------------------------------------------------------- workers


def worker_train(args):
    """The `train` worker mode: one setting in this process; returns its measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer, train_step, dataset, vocab, corpus = make_trainer(
            tmp,
            args.worker_config,
            data=args.data,
            lines=args.lines,
            replicas=args.worker_replicas,
            batch_size=args.batch_size,
            threads=args.threads,
            max_tokens=args.max_tokens,
            num_sampled=args.num_sampled,
            bucket_width=args.bucket_width,
            matmul_precision=args.matmul_precision,
        )
        iterator = iter(dataset)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            fwd, _, _ = train_step(iterator)
            float(fwd)
        warmup_s = time.perf_counter() - t0
        targets, wall0, cpu0 = 0.0, time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            _, _, count = train_step(iterator)
            targets += float(count)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        params = trainer.model.count_params()
        repeats = args.profile_repeats
        parts = (
            profile_parts(trainer, vocab, corpus, args.batch_size, args.max_tokens, repeats) if args.profile else None
        )
    options = trainer.model.config.to_options()
    num_sampled = min(args.num_sampled, len(vocab) - 1)
    fpt = flops_per_target(options, num_sampled)
    result = {
        "config": args.worker_config,
        "replicas": args.worker_replicas,
        "params": params,
        "batch_size": args.batch_size,
        "max_tokens": args.max_tokens,
        "num_sampled": num_sampled,
        "bucket_width": getattr(trainer.config, "bucket_width", 10),  # 97bf9b2's lm_dataset: 10
        "matmul_precision": getattr(trainer.config, "matmul_precision", "float32"),
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "warmup_seconds": warmup_s,
        "seconds": wall,
        "cpu_seconds": cpu,
        "targets": targets,
        "targets_per_s": targets / wall,
        "seconds_per_step": wall / args.steps,
        "cpu_utilization": cpu / wall,
        "gflops": 3 * fpt * targets / wall / 1e9,
        "forward_mflop_per_target": fpt / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "parts": parts,
    }
    return result


WORKERS = {"train": worker_train, "matmul": worker_matmul}


# ---------------------------------------------------------------------------------------------- driver


def run_train_worker(args, mode, extra, work, pythonpath=None):
    """`common.run_worker` of this script's worker `mode` (with `pythonpath`: another commit's elmo_tf); a failed
    worker is logged and returned as `{"error": ...}`, so the run goes on."""
    options = ["--data", args.data, "--threads", str(args.threads), *extra]
    try:
        return run_worker(__file__, mode, options, work, pythonpath=pythonpath, timeout=args.timeout)
    except WorkerError as e:
        log.error("%s", e)
        return {"error": str(e)}


def extract_commit(rev, into):
    """`rev`'s tree in `into` (git archive), and its full hash."""
    full = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if full.returncode:
        raise ValueError(f"--baseline: not a commit of this repository: {rev!r}")
    archive = subprocess.run(["git", "archive", full.stdout.strip()], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return full.stdout.strip()


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="ptb5m,original", type=lambda s: parse_list(s, str, "--configs"))
    p.add_argument("--replicas", default="1", type=lambda s: parse_list(s, int, "--replicas"))
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="commit to compare with ('none': ours only)")
    p.add_argument("--rounds", type=int, default=1, help="baseline/ours pairs per setting, median reported (1)")
    p.add_argument("--data", default=DEFAULT_DATA, help="one sentence per line (default: PTB train)")
    p.add_argument("--lines", type=int, default=5000, help="lines of --data to train on")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per step over all replicas (64)")
    p.add_argument("--max-tokens", type=int, default=None, help="default per setting (ptb5m 100, else 50)")
    p.add_argument("--num-sampled", type=int, default=None, help="default per setting (ptb5m 2048, else 8192)")
    p.add_argument("--bucket-width", type=int, default=0, help="ours: length-bucket width (0: TrainConfig's default)")
    p.add_argument(
        "--matmul-precision",
        default="float32",
        choices=("float32", "bfloat16"),
        help="ours: TrainConfig.matmul_precision, the dtype of the LSTM and softmax matmuls (float32); bfloat16 also "
        "measures a bfloat16 roofline",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default per setting; quick 2-3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per process (0: TensorFlow's default)")
    p.add_argument("--profile", action="store_true", help="also time the parts of one step (ours)")
    p.add_argument("--profile-repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, batch 32")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per worker")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    p.add_argument("--worker-replicas", type=int, help=argparse.SUPPRESS)
    p.add_argument("--matmul-repeats", type=int, default=3, help="timed matmuls per size of the roofline (3)")
    add_worker_flags(p, WORKERS)
    return p


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if not os.path.isfile(args.data):
        log.error("--data: no such file: %s", args.data)
        return 2
    if args.worker:
        return serve_worker(WORKERS, args)
    for name in args.configs:
        if name not in SETTINGS:
            log.error("--configs: unknown setting %r (choose from %s)", name, ", ".join(SETTINGS))
            return 2
    for r in args.replicas:
        if r < 1 or args.batch_size % r:
            log.error("--replicas: %d must be >= 1 and divide --batch-size %d", r, args.batch_size)
            return 2
    if args.rounds < 1:
        log.error("--rounds: must be >= 1, got %d", args.rounds)
        return 2
    if args.quick and args.batch_size == 64:
        args.batch_size = 32
    tmp = tempfile.mkdtemp(prefix="train_throughput-")
    try:
        baseline = None
        if args.baseline.lower() != "none":
            try:
                baseline = {"rev": args.baseline, "commit": extract_commit(args.baseline, tmp), "path": tmp}
            except ValueError as e:
                log.error("%s", e)
                return 2
        return run_all(args, baseline, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def setting_options(args, name, replicas):
    """The worker flags of setting `name` at `replicas` replicas: `(both, ours only)`; ours adds --bucket-width and
    --matmul-precision where given (a baseline's TrainConfig may lack them)."""
    setting = SETTINGS[name]
    steps = args.steps or (setting["quick_steps"] if args.quick else setting["steps"])
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    both = [
        *("--worker-config", name, "--worker-replicas", str(replicas), "--lines", str(args.lines)),
        *("--batch-size", str(args.batch_size), "--max-tokens", str(args.max_tokens or setting["max_tokens"])),
        *("--num-sampled", str(args.num_sampled or setting["num_sampled"]), "--steps", str(steps)),
        *("--warmup", str(warmup)),
    ]
    ours = ["--bucket-width", str(args.bucket_width)] if args.bucket_width else []
    if args.matmul_precision != "float32":
        ours += ["--matmul-precision", args.matmul_precision]
    return both, ours


def pooled(runs):
    """The median speed of a side's good `runs` (its rounds), their peak RSS, and the setting they ran; None when
    every round failed."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return None
    return {
        "targets_per_s": median([r["targets_per_s"] for r in good]),
        "gflops": median([r["gflops"] for r in good]),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in good),
        "seconds_per_step": median([r["seconds_per_step"] for r in good]),
        "params": good[0]["params"],
        "num_sampled": good[0]["num_sampled"],
        "max_tokens": good[0]["max_tokens"],
        "bucket_width": good[0].get("bucket_width"),
        "matmul_precision": good[0].get("matmul_precision", "float32"),
    }


def run_setting(args, baseline, work, name, replicas):
    """--rounds rounds of the baseline then ours (ours alone without a baseline) at one setting: the row of the
    results, with each round, each side pooled, our profile and the speed-up."""
    both, ours_only = setting_options(args, name, replicas)
    profile = ["--profile", "--profile-repeats", str(args.profile_repeats)] if args.profile else []
    rounds = {"baseline": [], "ours": []}
    for k in range(args.rounds):
        for who in ("baseline", "ours") if baseline else ("ours",):
            log.info("%s x%d, %s, round %d: %s", name, replicas, who, k + 1, " ".join(both[-4:]))
            extra = both + (ours_only + (profile if k == 0 else []) if who == "ours" else [])
            path = baseline["path"] if who == "baseline" else None
            r = run_train_worker(args, "train", extra, work, pythonpath=path)
            if "error" not in r:
                log.info("  %.0f targets/s, %.1f GFLOP/s", r["targets_per_s"], r["gflops"])
            rounds[who].append(r)
    row = {"config": name, "replicas": replicas, "rounds": rounds}
    for who, runs in rounds.items():
        side = pooled(runs)
        if side:
            row[who] = side
            parts = [r["parts"] for r in runs if "error" not in r and r.get("parts")]
            if parts:
                row["parts"] = parts[0]
    if "ours" in row and "baseline" in row:
        row["speedup"] = row["ours"]["targets_per_s"] / row["baseline"]["targets_per_s"]
    return row


def run_all(args, baseline, work):
    load_before = os.getloadavg()
    precision = ["--matmul-precision", args.matmul_precision]
    matmul = [run_train_worker(args, "matmul", precision, work)]
    log.info("matmul roofline before: %.0f GFLOP/s", matmul[0].get("best_gflops", float("nan")))
    results = [run_setting(args, baseline, work, name, r) for name in args.configs for r in args.replicas]
    matmul.append(run_train_worker(args, "matmul", precision, work))
    roofline = max(m.get("best_gflops", 0.0) for m in matmul)
    low_roofline = None
    if args.matmul_precision != "float32":  # None when its measurement failed (the workers' errors are in the JSON)
        low_roofline = max(m.get(args.matmul_precision, {}).get("best_gflops", 0.0) for m in matmul) or None
    print_table(args, baseline, results, matmul, roofline)
    print_profiles(results, roofline)
    print_low_precision(args, results, low_roofline)
    load_after = os.getloadavg()
    busy = max(load_before[0], load_after[0]) > 1.5
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}" + ("  (busy machine)" if busy else ""))
    from importlib.metadata import version

    record = {
        "benchmark": "train_throughput",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **result_fields(load_before, load_after),  # git_commit, date, cpu: what bench/tables.py record names it by
        "baseline": {k: baseline[k] for k in ("rev", "commit")} if baseline else None,
        "machine": {"tensorflow": version("tensorflow")},
        "roofline_gflops": roofline,
        "matmul_precision": args.matmul_precision,
        "low_precision_roofline_gflops": low_roofline,
        "matmul": matmul,
        "settings": {k: getattr(args, k) for k in ("batch_size", "lines", "data", "threads", "rounds", "quick")},
        "results": results,
    }
    write_result(args.out, record)
    failed = any("error" in r for row in results for runs in row["rounds"].values() for r in runs)
    return 1 if failed else 0


def print_profiles(results, roofline):
    """The profile of one step of each setting that has one: ms, GFLOP/s and share of the roofline per part."""
    for row in results:
        if not row.get("parts"):
            continue
        prof = row["parts"]
        print()
        print(
            f"profile of one step, {row['config']}: batch of {prof['rows']} sentences x {prof['length']} tokens "
            f"({prof['targets']} targets, {prof['positions']} positions with <S>/</S> and padding); forward + backward"
        )
        print("| part | ms | GFLOP/s | % roofline |")
        print("|---|---:|---:|---:|")
        for part in prof["parts"]:
            gflops = part["gflops"]
            print(
                f"| {part['part']} | {part['ms']:.1f} | {'-' if gflops is None else f'{gflops:.1f}'} | "
                f"{'-' if gflops is None else f'{gflops / roofline:.0%}'} |"
            )


def print_table(args, baseline, results, matmul, roofline):
    """Ours beside the baseline per setting; sets each side's `fraction_of_roofline`."""
    print()
    print(
        f"biLM training throughput (forward + backward + Adagrad update), batch {args.batch_size} sentences, "
        f"{os.cpu_count()} CPUs; roofline {roofline:.0f} GFLOP/s (TF float32 matmul, before/after: "
        f"{matmul_sizes_text([m for m in matmul if 'sizes' in m] or [{}])})"
    )
    base_name = baseline["rev"] if baseline else "-"
    print(
        f"| config | params | replicas | sampled | ours targets/s | {base_name} targets/s | speed-up | "
        "ours GFLOP/s | % roofline (ours / base) | peak RSS MB (ours / base) | buckets (ours / base) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in results:
        ours, base = row.get("ours"), row.get("baseline")
        if not ours:
            print(f"| {row['config']} | - | {row['replicas']} | - | failed | | | | | | |")
            continue
        for side in (ours, base) if base else (ours,):
            side["fraction_of_roofline"] = side["gflops"] / roofline if roofline else None
        nan = float("nan")
        print(
            f"| {row['config']} | {ours['params'] / 1e6:.2f}M | {row['replicas']} | {ours['num_sampled']} | "
            f"{ours['targets_per_s']:.0f} | {base['targets_per_s'] if base else nan:.0f} | "
            f"{row.get('speedup', nan):.2f}x | {ours['gflops']:.1f} | "
            f"{ours['fraction_of_roofline']:.0%} / {base['fraction_of_roofline'] if base else nan:.0%} | "
            f"{ours['peak_rss_mb']:.0f} / {base['peak_rss_mb'] if base else nan:.0f} | "
            f"{ours['bucket_width']} / {base['bucket_width'] if base else '-'} |"
        )


def print_low_precision(args, results, low_roofline):
    """Ours as a share of the bfloat16 roofline, where --matmul-precision is not float32 and it was measured."""
    if low_roofline:
        print(
            f"ours ran its LSTM and softmax matmuls in {args.matmul_precision} (the baseline float32); "
            f"{args.matmul_precision} matmul roofline {low_roofline:.0f} GFLOP/s: ours at "
            + ", ".join(
                f"{row['config']} {row['ours']['gflops'] / low_roofline:.0%}" for row in results if row.get("ours")
            )
            + " of it"
        )


if __name__ == "__main__":
    sys.exit(main())
