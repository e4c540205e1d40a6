"""NER quality with and without ELMo: CoNLL-2003 and WNUT-17 span F1 (dev and test), several seeds, mean/std.

What it runs: `training/train_ner.py` once per (dataset, variant, seed), each in its own subprocess, with the
same head and settings for both variants:
  - `elmo`:    ELMo features from --bilm (a training/pretrain.py output dir) + the head's own word embedding
               and char CNN; the features are computed once per dataset and cached (hdf5) for all seeds;
  - `no-elmo`: the same head without ELMo (word embedding learned from the training set + char CNN).
A run whose output directory already holds metrics.json is reused, so an interrupted benchmark continues
where it stopped (delete --workdir to start over). Span F1 is exact-match, as conlleval computes it.

The table answers: how many F1 points our ELMo adds, next to the paper's +2.06 (Peters et al. 2018,
CoNLL-2003 test 92.22 with ELMo vs 90.15 without; their baseline has GloVe embeddings and a 1B-word biLM).

usage: .venv/bin/python bench/ner_quality.py --bilm runs/ner_bilm [--data ../shared/data]
       [--datasets conll2003,wnut17] [--variants no-elmo,elmo] [--seeds 1,2,3] [--epochs 12] [--patience 3]
       [--workdir bench/results/ner_runs] [--out bench/results/ner_quality.json] [--dry-run]
Writes the JSON record and prints a markdown table.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from common import parse_list, result_fields, write_result  # bench/common.py, beside this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = {
    "conll2003": ("conll2003/eng.train", "conll2003/eng.testa", "conll2003/eng.testb"),
    "wnut17": ("wnut17/wnut17train.conll", "wnut17/emerging.dev.conll", "wnut17/emerging.test.annotated"),
}
VARIANTS = ("no-elmo", "elmo")
PAPER = {"conll2003": {"no-elmo": 90.15, "elmo": 92.22}}


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bilm", help="training/pretrain.py output dir (needed for the elmo variant)")
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"), help="dir with conll2003/, wnut17/")
    p.add_argument("--datasets", default=list(DATASETS), type=lambda s: parse_list(s, str, "--datasets"))
    p.add_argument("--variants", default=list(VARIANTS), type=lambda s: parse_list(s, str, "--variants"))
    p.add_argument("--seeds", default=[1, 2, 3], type=lambda s: parse_list(s, int, "--seeds"))
    p.add_argument("--epochs", type=int, default=12, help="epoch cap per run (early stopping on dev F1 inside)")
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--lstm-units", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="TF intra/inter-op threads per run (0: default)")
    p.add_argument(
        "--elmo-args",
        default="",
        help="extra train_ner.py flags of the elmo variant, the ELMo recipe levers, given with '=': e.g. "
        "--elmo-args='--mix-layer-norm --mix-l2 0.001 --gamma 1.0' or --elmo-args=--mix-layer-norm (argparse takes "
        "a lone '--flag' after a space for an option of its own); a different setting needs its own --workdir: "
        "finished runs are reused",
    )
    p.add_argument("--workdir", default=os.path.join(ROOT, "bench", "results", "ner_runs"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ner_quality.json"))
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p


def run_one(args, dataset, variant, seed):
    """metrics.json of one run (reused when present) plus its wall/CPU seconds."""
    out_dir = os.path.join(args.workdir, dataset, variant, f"seed{seed}")
    metrics_path = os.path.join(out_dir, "metrics.json")
    train, dev, test = (os.path.join(args.data, p) for p in DATASETS[dataset])
    cmd = [
        sys.executable,
        os.path.join(ROOT, "training", "train_ner.py"),
        "--train",
        train,
        "--dev",
        dev,
        "--test",
        test,
        "--output",
        out_dir,
        "--seed",
        str(seed),
        "--epochs",
        str(args.epochs),
        "--patience",
        str(args.patience),
        "--lstm-units",
        str(args.lstm_units),
        "--batch-size",
        str(args.batch_size),
    ]
    if variant == "elmo":
        cmd += ["--elmo", args.bilm, "--cache", os.path.join(args.workdir, dataset, "elmo_features.h5")]
        cmd += shlex.split(args.elmo_args)
    else:
        cmd += ["--no-elmo"]
    if args.dry_run:
        print(" ".join(cmd))
        return None
    if not os.path.exists(metrics_path):
        os.makedirs(out_dir, exist_ok=True)
        env = dict(os.environ)
        if args.threads:
            env["TF_NUM_INTRAOP_THREADS"] = env["TF_NUM_INTEROP_THREADS"] = str(args.threads)
        print(f"[{time.strftime('%H:%M:%S')}] {dataset} {variant} seed {seed}: training -> {out_dir}", flush=True)
        before = os.times()
        start = time.perf_counter()
        with open(os.path.join(out_dir, "train.log"), "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        after = os.times()
        if proc.returncode != 0:
            raise SystemExit(
                f"{dataset} {variant} seed {seed}: train_ner.py exited {proc.returncode}; "
                f"see {os.path.join(out_dir, 'train.log')}"
            )
        with open(os.path.join(out_dir, "bench_time.json"), "w") as f:
            json.dump(
                {
                    "wall_s": time.perf_counter() - start,
                    "cpu_s": (after.children_user - before.children_user)
                    + (after.children_system - before.children_system),
                },
                f,
            )
    with open(metrics_path) as f:
        metrics = json.load(f)
    timing_path = os.path.join(out_dir, "bench_time.json")
    if os.path.exists(timing_path):
        with open(timing_path) as f:
            metrics["timing"] = json.load(f)
    print(
        f"  {dataset} {variant} seed {seed}: dev F1 {metrics['dev']['f1']:.2f}, test F1 "
        f"{metrics['test']['f1']:.2f}, best epoch {metrics['best_epoch']}",
        flush=True,
    )
    return metrics


def mean_std(values):
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)


def check_args(parser, args):
    """`parser.error` naming the first flag whose value cannot run."""
    for name in args.datasets:
        if name not in DATASETS:
            parser.error(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
        for path in DATASETS[name]:
            if not os.path.isfile(os.path.join(args.data, path)):
                parser.error(f"--data: {os.path.join(args.data, path)!r} does not exist")
    for name in args.variants:
        if name not in VARIANTS:
            parser.error(f"--variants: unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    if "elmo" in args.variants:
        if not args.bilm or not os.path.isfile(os.path.join(args.bilm, "weights.hdf5")):
            parser.error(f"--bilm: needs a training/pretrain.py output dir with weights.hdf5, got {args.bilm!r}")
    for flag in ("epochs", "patience", "lstm_units", "batch_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")


def variant_summary(ms):
    """Mean and std of the dev and test F1 over the seeds' metrics `ms`, their best epochs, minutes and per-type F1."""
    minutes = [m["timing"]["wall_s"] / 60 for m in ms if "timing" in m]
    return {
        "dev_f1": mean_std([m["dev"]["f1"] for m in ms]),
        "test_f1": mean_std([m["test"]["f1"] for m in ms]),
        "best_epochs": [m["best_epoch"] for m in ms],
        "wall_minutes_mean": statistics.mean(minutes) if minutes else None,
        "per_type_test_f1": {
            t: statistics.mean(m["test"]["per_type"][t]["f1"] for m in ms) for t in ms[0]["test"].get("per_type", {})
        },
    }


def summarize(args, runs):
    """Per dataset and variant `variant_summary`, and ELMo's gain where both variants ran; prints them as a table."""
    summary = {}
    print()
    print("| dataset | variant | seeds | dev F1 mean ± std | test F1 mean ± std | best epochs | min/run | paper test |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for d in args.datasets:
        summary[d] = {}
        for v in args.variants:
            ms = list(runs[d][v].values())
            one = summary[d][v] = variant_summary(ms)
            dev, test, minutes, paper = one["dev_f1"], one["test_f1"], one["wall_minutes_mean"], PAPER.get(d, {}).get(v)
            print(
                f"| {d} | {v} | {len(ms)} | {dev[0]:.2f} ± {dev[1]:.2f} | {test[0]:.2f} ± {test[1]:.2f} "
                f"| {','.join(str(m['best_epoch']) for m in ms)} "
                f"| {minutes if minutes is not None else float('nan'):.1f} | {paper if paper else '-'} |"
            )
        if set(VARIANTS) <= set(args.variants):
            gain = {k: summary[d]["elmo"][k][0] - summary[d]["no-elmo"][k][0] for k in ("dev_f1", "test_f1")}
            summary[d]["elmo_gain"] = gain
            print(
                f"| {d} | **ELMo gain** | | {gain['dev_f1']:+.2f} | {gain['test_f1']:+.2f} | | "
                f"| {'+2.06' if d == 'conll2003' else '-'} |"
            )
    return summary


def bilm_files(bilm):
    """The biLM's options.json, train_config.json and metrics.json (those present) of the directory `bilm`."""
    info = {}
    for name in ("options.json", "train_config.json", "metrics.json") if bilm else ():
        path = os.path.join(bilm, name)
        if os.path.exists(path):
            with open(path) as f:
                info[name] = json.load(f)
    return info


SETTINGS = (
    "datasets",
    "variants",
    "seeds",
    "epochs",
    "patience",
    "lstm_units",
    "batch_size",
    "bilm",
    "data",
    "elmo_args",
)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    runs = {d: {v: {s: run_one(args, d, v, s) for s in args.seeds} for v in args.variants} for d in args.datasets}
    if args.dry_run:
        return 0
    summary = summarize(args, runs)
    record = {
        "benchmark": "ner_quality",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **result_fields(),
        "settings": {k: getattr(args, k) for k in SETTINGS},
        "bilm": bilm_files(args.bilm),
        "summary": summary,
        "runs": {d: {v: {str(s): m for s, m in r.items()} for v, r in vs.items()} for d, vs in runs.items()},
    }
    print()
    write_result(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
