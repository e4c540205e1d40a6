"""The language-modelling cost of `--precision bfloat16` (issue 51): a pretrained biLM's perplexity on PTB test scored
by `elmo-tf score` computing in float32 and in bfloat16 (the biLM's and the softmax's matmuls), side by side.

Spec: a pretraining run directory (options.json, weights.hdf5, softmax.hdf5, vocab.txt: `bench/pretrain_ptb.py`'s
model, or any `elmo-tf pretrain` output) and PTB test (../shared/data/ptb/ptb.test.txt, 3,761 lines). Each precision
runs `elmo-tf score --model RUN --input TEST --precision P` in its own process (full softmax over the vocabulary; each
sentence scored on its own from <S>, as pretrain_ptb.py's evaluation does). Perplexity per direction is
exp(-(sum of the log-probabilities) / targets), targets = words + </S> forward, words + <S> backward; the average is
the mean of the two directions' log-likelihoods. The budget: bfloat16 within +0.5% of float32 (relative).

usage: .venv/bin/python bench/precision_perplexity.py --run bench/results/pretrain_ptb_run/model
       [--data ../shared/data/ptb/ptb.test.txt] [--lines 0] [--out bench/results/precision_perplexity.json]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from common import REPO, RESULTS, SHARED, head_lines, result_fields, write_result

DEFAULT_DATA = os.path.join(SHARED, "data", "ptb", "ptb.test.txt")
DEFAULT_OUT = os.path.join(RESULTS, "precision_perplexity.json")
PRECISIONS = ("float32", "bfloat16")
BUDGET = 0.005  # bfloat16's perplexity at most 0.5% above float32's (issue 51)


def score(run, data, precision, output):
    """`elmo-tf score` of `data` by the model in `run` at `precision` into `output`; its wall seconds."""
    command = [os.path.join(os.path.dirname(sys.executable), "elmo-tf"), "score", "--model", run, "--input", data]
    command += ["--output", output, "--precision", precision, "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"precision_perplexity.py: {' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return time.perf_counter() - start


def perplexities(path):
    """Forward, backward and average perplexity of a `score` output, and its target count per direction."""
    forward = backward = 0.0
    targets = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            assert len(record["forward_log_probs"]) == len(record["backward_log_probs"]) == len(record["tokens"]) + 1
            forward += sum(record["forward_log_probs"])
            backward += sum(record["backward_log_probs"])
            targets += len(record["forward_log_probs"])
    return {
        "forward": math.exp(-forward / targets),
        "backward": math.exp(-backward / targets),
        "average": math.exp(-(forward + backward) / (2 * targets)),
        "targets": targets,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="pretraining run directory (options, weights, softmax, vocab)")
    p.add_argument("--data", default=DEFAULT_DATA, help="one sentence per line (PTB test)")
    p.add_argument("--lines", type=int, default=0, help="score the first N lines only (0: all)")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON results")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = head_lines(args.data, args.lines, os.path.join(tmp, "input.txt")) if args.lines else args.data
        for precision in PRECISIONS:
            output = os.path.join(tmp, f"{precision}.jsonl")
            seconds = score(args.run, data, precision, output)
            rows[precision] = dict(perplexities(output), seconds=seconds)
    base = rows["float32"]
    for row in rows.values():
        row["relative_to_float32"] = {k: row[k] / base[k] - 1 for k in ("forward", "backward", "average")}
    print(f"perplexity on {args.data} ({base['targets']:,} targets per direction), model {args.run}")
    print("| precision | forward | backward | average | average vs float32 | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for precision, row in rows.items():
        rel = row["relative_to_float32"]["average"]
        print(
            f"| {precision} | {row['forward']:.3f} | {row['backward']:.3f} | {row['average']:.3f} | {rel:+.3%} |"
            f" {row['seconds']:.0f} |"
        )
    worst = max(rows["bfloat16"]["relative_to_float32"].values())
    print(f"bfloat16's worst direction: {worst:+.3%} (budget +{BUDGET:.1%}): {'within' if worst <= BUDGET else 'OVER'}")
    result = dict(
        result_fields(load_before),
        run=os.path.abspath(args.run),
        data=os.path.abspath(args.data),
        lines=args.lines,
        precisions=rows,
        budget=BUDGET,
        within_budget=worst <= BUDGET,
    )
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
