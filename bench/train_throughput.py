"""biLM training throughput on this machine: target tokens/s of forward + backward + update (sampled
softmax), for the `small` and `original` presets, on 1 and 2 replicas, in one run.

How it is measured:
  - every (config, replicas) setting runs in its own subprocess (a worker mode of this script), because
    `--cpu-replicas` splits the CPU into logical devices, which TensorFlow allows only before its first op;
  - the worker builds `elmo_tf.pretrain.Trainer` exactly as training/pretrain.py does (MirroredStrategy over
    the local devices: 1 or 2 logical CPUs; Adagrad, clip 10, dropout 0.1, --num-sampled log-uniform
    negatives) and drives its compiled train step (`Trainer._dataset` / `Trainer._train_step`, the step
    `Trainer.train` runs), without checkpoints or logs;
  - data: the first --lines lines of PTB train (natural sentence lengths, length-bucketed batches of
    --batch-size sentences over all replicas), vocabulary: PTB's 9,999 word types + 3 specials;
  - --warmup untimed steps (tracing, first allocations), then --steps timed steps; each step syncs on
    its loss. Tokens = targets per direction (words + </S>), as the training log counts them;
  - reported: targets/s, seconds per step, an estimate of achieved GFLOP/s (3 x the forward matmul FLOP
    per position: char CNN, highway, projection, LSTMs, plus the sampled softmax logits of both
    directions), the speed-up of 2 replicas over 1, CPU utilization (process CPU s / wall s over the timed
    steps) and peak RSS.
The softmax cost depends on --num-sampled (8192, the original recipe) and not on the vocabulary size;
with the 10k PTB vocabulary 8192 negatives are close to a full softmax.

Two replicas on one CPU do not add compute: they split each batch in two and add an all-reduce, so the
speed-up on a single CPU shows the overhead of the distribution path (and any gain from running two
smaller graphs concurrently); on 2 GPUs or 2 machines each replica gets its own device.

usage: .venv/bin/python bench/train_throughput.py --quick          # smoke run: a few steps per setting
       .venv/bin/python bench/train_throughput.py                  # full run, alone on the machine
       [--configs small,original] [--replicas 1,2] [--batch-size 64] [--threads 0] [--out PATH]
Writes bench/results/train_throughput.json.
"""

import argparse
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "ptb", "ptb.train.txt"))
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "train_throughput.json")
log = logging.getLogger("train_throughput")


def forward_flops_per_position(options, num_sampled):
    """Matmul FLOP (2 per multiply-add) of one forward pass per position, sampled softmax of both
    directions included."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    chars, char_dim = cnn["max_characters_per_token"], cnn["embedding"]["dim"]
    filters = cnn["filters"]
    n_filters = sum(n for _, n in filters)
    units, proj, layers = lstm["dim"], lstm["projection_dim"], lstm["n_layers"]
    flops = sum(2 * (chars - w + 1) * w * char_dim * n for w, n in filters)
    flops += cnn.get("n_highway", 0) * 2 * (2 * n_filters * n_filters)
    if n_filters != proj:
        flops += 2 * n_filters * proj
    flops += 2 * layers * (2 * (proj + proj) * 4 * units + 2 * units * proj)
    flops += 2 * 2 * (num_sampled + 1) * proj
    return flops


def worker(args):
    """One setting in this process: prints one JSON line."""
    import tensorflow as tf

    from elmo_tf.config import get_config
    from elmo_tf.distribute import get_strategy, set_cpu_replicas
    from elmo_tf.io.vocabulary import build_vocabulary, count_words
    from elmo_tf.pretrain import TrainConfig, Trainer

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    set_cpu_replicas(args.worker_replicas)
    import keras

    keras.utils.set_random_seed(0)
    vocab = build_vocabulary(count_words([args.data]))
    strategy = get_strategy("mirrored")
    config = get_config(args.worker_config)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "train.txt")
        with open(args.data, "rb") as src, open(corpus, "wb") as dst:
            for k, line in enumerate(src):
                if k >= args.lines:
                    break
                dst.write(line)
        train_config = TrainConfig(
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            steps=10**6,
            num_sampled=args.num_sampled,
            shuffle_buffer=args.lines,
        )
        trainer = Trainer(strategy, config, train_config, vocab, [corpus], os.path.join(tmp, "run"))
        iterator = iter(trainer._dataset(0))
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            fwd, _, _ = trainer._train_step(iterator)
            float(fwd)
        warmup_s = time.perf_counter() - t0
        targets, wall0, cpu0 = 0.0, time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            _, _, count = trainer._train_step(iterator)
            targets += float(count)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        params = trainer.model.count_params()
    fpp = forward_flops_per_position(config.to_options(), min(args.num_sampled, len(vocab) - 1))
    result = {
        "config": args.worker_config,
        "replicas": strategy.num_replicas_in_sync,
        "params": params,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "warmup_seconds": warmup_s,
        "seconds": wall,
        "cpu_seconds": cpu,
        "targets": targets,
        "targets_per_s": targets / wall,
        "seconds_per_step": wall / args.steps,
        "cpu_utilization": cpu / wall,
        "gflops_estimate": 3 * fpp * targets / wall / 1e9,
        "forward_mflop_per_position": fpp / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_setting(args, config, replicas, steps, warmup):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker-config",
        config,
        "--worker-replicas",
        str(replicas),
        "--data",
        args.data,
        "--lines",
        str(args.lines),
        "--batch-size",
        str(args.batch_size),
        "--max-tokens",
        str(args.max_tokens),
        "--num-sampled",
        str(args.num_sampled),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--threads",
        str(args.threads),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        log.error("%s x%d failed (exit %d):\n%s", config, replicas, proc.returncode, proc.stderr[-3000:])
        return {"config": config, "replicas": replicas, "error": proc.stderr[-3000:], "returncode": proc.returncode}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["process_seconds"] = time.perf_counter() - t0
    return result


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="small,original", help="presets, comma-separated")
    p.add_argument("--replicas", default="1,2", help="replica counts, comma-separated")
    p.add_argument("--data", default=DEFAULT_DATA, help="one sentence per line (default: PTB train)")
    p.add_argument("--lines", type=int, default=5000, help="lines of --data to train on")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per step over all replicas (64)")
    p.add_argument("--max-tokens", type=int, default=50)
    p.add_argument("--num-sampled", type=int, default=8192)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20 small / 6 original; quick 3 / 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per process (0: TensorFlow's default)")
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, batch 32")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per setting")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    p.add_argument("--worker-replicas", type=int, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if not os.path.isfile(args.data):
        log.error("--data: no such file: %s", args.data)
        return 2
    if args.worker_config:
        args.steps = args.steps or 1
        args.warmup = 1 if args.warmup is None else args.warmup
        return worker(args)
    if args.quick and args.batch_size == 64:
        args.batch_size = 32
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    replica_counts = [int(r) for r in args.replicas.split(",")]
    for r in replica_counts:
        if r < 1 or args.batch_size % r:
            log.error("--replicas: %d must be >= 1 and divide --batch-size %d", r, args.batch_size)
            return 2
    load_before = os.getloadavg()
    results = []
    for config in configs:
        steps = args.steps or ((3 if args.quick else 20) if config == "small" else (2 if args.quick else 6))
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
        for replicas in replica_counts:
            log.info(
                "%s, %d replica(s): %d warm-up + %d timed steps of %d sentences",
                config,
                replicas,
                warmup,
                steps,
                args.batch_size,
            )
            result = run_setting(args, config, replicas, steps, warmup)
            if "error" not in result:
                log.info(
                    "  %.0f targets/s, %.2f s/step, ~%.1f GFLOP/s, CPU %.0f%%, peak RSS %.0f MB",
                    result["targets_per_s"],
                    result["seconds_per_step"],
                    result["gflops_estimate"],
                    100 * result["cpu_utilization"],
                    result["peak_rss_mb"],
                )
            results.append(result)
    load_after = os.getloadavg()
    base = {r["config"]: r["targets_per_s"] for r in results if r.get("replicas") == 1 and "error" not in r}
    for r in results:
        if "error" not in r and r["config"] in base:
            r["speedup_vs_1"] = r["targets_per_s"] / base[r["config"]]

    print()
    print(
        f"biLM training throughput (forward + backward + Adagrad update, sampled softmax {args.num_sampled}), "
        f"batch {args.batch_size} sentences, {os.cpu_count()} CPUs"
    )
    print("| config | params | replicas | targets/s | s/step | vs 1 replica | ~GFLOP/s | CPU util | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['config']} | - | {r['replicas']} | failed (exit {r['returncode']}) | | | | | |")
            continue
        print(
            f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['replicas']} | {r['targets_per_s']:.0f} | "
            f"{r['seconds_per_step']:.2f} | {r.get('speedup_vs_1', float('nan')):.2f}x | {r['gflops_estimate']:.1f} "
            f"| {100 * r['cpu_utilization']:.0f}% | {r['peak_rss_mb']:.0f} |"
        )
    print(
        f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}"
        + ("  (busy machine: numbers are only a smoke test)" if max(load_before[0], load_after[0]) > 1.5 else "")
    )

    from importlib.metadata import version

    record = {
        "benchmark": "train_throughput",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "tensorflow": version("tensorflow"),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "settings": {
            "batch_size": args.batch_size,
            "max_tokens": args.max_tokens,
            "num_sampled": args.num_sampled,
            "lines": args.lines,
            "data": args.data,
            "threads": args.threads,
            "quick": args.quick,
        },
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    log.info("wrote %s", args.out)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
