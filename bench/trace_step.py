"""Op-level profile of our compiled biLM training step: where a step's time goes, by op type and by op.

bench/train_throughput.py --profile times the parts of a step (char CNN, each LSTM layer, softmax, update) one at a
time; this traces the whole step as training runs it (the Trainer's compiled step on its own tf.data input, as in
train_throughput.py) with tf.profiler and sums the traced ops' durations per step:
  - by op type (MatMul, Transpose, SelectV2, ...), and by op type within each loop: the LSTM forward loops
    (`.../bilm/while`), the hand-written backward loops (`while` at the top level of the gradient), the rest;
  - the slowest single ops.
Durations are per executor thread and ops overlap on the 2 cores, so the sums exceed the step's wall time; the
tracer also adds a few microseconds per op, so the traced step is slower than an untraced one. Compare runs of
this script with each other, not with train_throughput.py.

usage: .venv/bin/python bench/trace_step.py [--config ptb5m|small|original] [--steps 10] [--top 30] [--out PATH]
Writes bench/results/trace_step.json.
"""

import argparse
import collections
import glob
import os
import re
import tempfile
import time

from bilm_trainer import SETTINGS, make_trainer  # bench/bilm_trainer.py: the Trainer train_throughput.py drives
from common import git_commit, write_result  # bench/common.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "trace_step.json")


def loop_of(op_name):
    """Which loop a traced op ran in, from its name."""
    if re.search(r"/bilm(_\d+)?/while", op_name):
        return "LSTM forward loops"
    if op_name.startswith("while/") or op_name.startswith("while_"):
        return "LSTM backward loops"
    return "outside the loops"


def trace(args):
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as tmp:
        _, train_step, dataset, _, _ = make_trainer(tmp, args.config)
        iterator = iter(dataset)
        for _ in range(3):
            float(train_step(iterator)[0])
        logdir = os.path.join(tmp, "trace")
        tf.profiler.experimental.start(logdir)
        start, targets = time.perf_counter(), 0.0
        for _ in range(args.steps):
            targets += float(train_step(iterator)[2])
        wall = time.perf_counter() - start
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    by_type, by_loop, by_op = collections.Counter(), collections.Counter(), collections.Counter()
    for plane in space.planes:
        if "host:CPU" not in plane.name:
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name or " " in name:  # not a TF op: executor, function, iterator
                    continue
                op, kind = name.rsplit(":", 1)
                ms = event.duration_ps / 1e9 / args.steps
                by_type[kind] += ms
                by_loop[(loop_of(op), kind)] += ms
                by_op[name] += ms
    return {
        "config": args.config,
        "commit": git_commit(REPO),
        "steps": args.steps,
        "traced_ms_per_step": wall * 1000 / args.steps,
        "targets_per_s_traced": targets / wall,
        "by_type": dict(by_type.most_common(args.top)),
        "by_loop": {f"{loop} | {kind}": ms for (loop, kind), ms in by_loop.most_common(args.top)},
        "by_op": dict(by_op.most_common(args.top)),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="ptb5m", choices=sorted(SETTINGS))
    p.add_argument("--steps", type=int, default=10, help="traced steps (after 3 untraced)")
    p.add_argument("--top", type=int, default=30, help="rows per table")
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.top < 1:
        p.error(f"--top must be >= 1, got {args.top}")
    result = trace(args)
    print(
        f"{result['config']} at {result['commit']}: {result['traced_ms_per_step']:.0f} ms per traced step, "
        f"{result['targets_per_s_traced']:.0f} targets/s traced; op time in thread-ms per step"
    )
    for title, rows in (("op type", result["by_type"]), ("loop | op type", result["by_loop"]), ("op", result["by_op"])):
        print(f"\n| {title} | ms/step |\n|---|---:|")
        for name, ms in rows.items():
            print(f"| {name[:110]} | {ms:.1f} |")
    print()
    write_result(args.out, result)


if __name__ == "__main__":
    main()
