"""Beam's DirectRunner (`elmo-tf beam-embed`, 2 worker processes) against `elmo-tf embed` on the same file, batch and
model: tokens/s, and whether the merged shards equal embed's output (issue 29: Beam >= 85% of embed's tokens/s on 2
cores, or what stands in the way, measured).

How it is measured:
  - random weights of --preset (seeded, `elmo_tf.models.save_elmo`) written once into --weights-dir and reused;
  - the first --n-sentences non-empty lines of the GMB news sentences (bench/sentences.py), plus the same file
    doubled (--sizes 1,2): each tool runs as its own command-line subprocess, one after the other, on each size;
  - tokens/s end to end = tokens / wall seconds of the whole command (Python and TensorFlow start-up, model
    loading, Beam's worker start-up, writing the hdf5 included); marginal tokens/s = extra tokens / extra seconds
    between the two sizes: the steady rate once the fixed start-up costs are paid (what a long corpus sees);
  - embed: `--threads --threads` (one process); Beam: `--direct_num_workers 2 --direct_running_mode
    multi_processing --num-shards 2 --threads --beam-threads` (two processes sharing the same cores);
  - the Beam shards are merged (`elmo-tf merge-shards`) and compared with embed's file: the same dataset names and
    sentence_to_index, and the largest absolute difference of the values.

usage: python bench/beam_throughput.py [--quick] [--preset original] [--n-sentences 1000] [--batch-size 32]
    --quick: the small preset, 200 sentences, one size: a smoke run (under 2 minutes on an idle machine).
Run it alone on the machine: the two tools run one after the other and share nothing but the cores.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import REPO, RESULTS, ensure_weights, result_fields, write_result  # bench/common.py, beside this script
from sentences import load_sentences, write_sentences


def command(args, env):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(map(str, args))}\n{result.stderr[-3000:]}")
    return seconds


def compare(embed_path, merged_path):
    import h5py
    import numpy as np

    with h5py.File(embed_path, "r") as a, h5py.File(merged_path, "r") as b:
        same_names = set(a) == set(b)
        same_index = a["sentence_to_index"][0] == b["sentence_to_index"][0]
        diff = max(
            (float(np.max(np.abs(a[k][...] - b[k][...]), initial=0.0)) for k in a if k != "sentence_to_index"),
            default=0.0,
        )
    return {"same_names": same_names, "same_sentence_to_index": bool(same_index), "max_abs_diff": diff}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small preset, 200 sentences, one size")
    p.add_argument("--preset", default=None, help="model shapes: original, medium, small (original)")
    p.add_argument("--n-sentences", type=int, default=None, help="sentences of the base file (1000)")
    p.add_argument("--sizes", default=None, help="multiples of the base file to run, comma-separated (1,2)")
    p.add_argument("--batch-size", type=int, default=32, help="--batch-size of both tools (32)")
    p.add_argument("--threads", type=int, default=2, help="embed's --threads (2)")
    p.add_argument("--beam-threads", type=int, default=1, help="--threads of each of Beam's 2 workers (1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights-dir", default=None, help="random weights cache (bench/results/cache/<preset>-seed<seed>)")
    p.add_argument("--out", default=os.path.join(RESULTS, "beam_throughput.json"))
    args = p.parse_args(argv)
    preset = args.preset or ("small" if args.quick else "original")
    n = args.n_sentences or (200 if args.quick else 1000)
    sizes = [int(s) for s in (args.sizes or ("1" if args.quick else "1,2")).split(",")]
    weights_dir = args.weights_dir or os.path.join(RESULTS, "cache", f"{preset}-seed{args.seed}")
    os.makedirs(weights_dir, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    options, weights = ensure_weights(weights_dir, preset, args.seed)
    model = ["--options", options, "--weights", weights, "--batch-size", args.batch_size]
    sentences = load_sentences(n)
    rows = []
    with tempfile.TemporaryDirectory(prefix="beam_bench_") as work:
        for size in sizes:
            text = write_sentences(sentences * size, os.path.join(work, f"x{size}.txt"))
            tokens = sum(len(s.split()) for s in sentences) * size
            embed_out, prefix = os.path.join(work, f"embed{size}.hdf5"), os.path.join(work, f"beam{size}")
            t_embed = command(
                ["-m", "elmo_tf", "embed", *model, "--threads", args.threads, "--input", text, "--output", embed_out],
                env,
            )
            t_beam = command(
                ["-m", "elmo_tf.beam", *model, "--threads", args.beam_threads, "--input", text, "--output", prefix]
                + ["--num-shards", 2, "--direct_num_workers", 2, "--direct_running_mode", "multi_processing"],
                env,
            )
            merged = os.path.join(work, f"merged{size}.hdf5")
            command(["-m", "elmo_tf", "merge-shards", "--input", prefix, "--output", merged], env)
            row = {"lines": n * size, "tokens": tokens, "embed_s": t_embed, "beam_s": t_beam}
            row.update(embed_tok_s=tokens / t_embed, beam_tok_s=tokens / t_beam, ratio=t_embed / t_beam)
            row.update(compare(embed_out, merged))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    result = {"preset": preset, "batch_size": args.batch_size, "threads": args.threads, "rows": rows}
    result["load_average"] = os.getloadavg()
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        dt = b["tokens"] - a["tokens"]
        result["marginal"] = {
            "embed_tok_s": dt / (b["embed_s"] - a["embed_s"]),
            "beam_tok_s": dt / (b["beam_s"] - a["beam_s"]),
        }
        result["marginal"]["ratio"] = result["marginal"]["beam_tok_s"] / result["marginal"]["embed_tok_s"]
    result.update(result_fields())  # git_commit, date, cpu (what bench/tables.py names a run by), platform
    print(f"{'lines':>7} {'tokens':>8} {'embed tok/s':>12} {'beam tok/s':>11} {'beam/embed':>10} {'max diff':>9}")
    for r in rows:
        print(
            f"{r['lines']:>7} {r['tokens']:>8} {r['embed_tok_s']:>12.0f} {r['beam_tok_s']:>11.0f} {r['ratio']:>10.2f}"
            f" {r['max_abs_diff']:>9.1e}"
        )
    if "marginal" in result:
        m = result["marginal"]
        print(
            f"marginal (start-up excluded): embed {m['embed_tok_s']:.0f} tok/s, beam {m['beam_tok_s']:.0f} tok/s, "
            f"ratio {m['ratio']:.2f}"
        )
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
