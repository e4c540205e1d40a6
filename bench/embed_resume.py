"""Resume cost, float16 outputs and memory of `python -m elmo_tf embed` (issue 29), each run as a user runs it.

Spec (targets in brackets):
  1. resume: the wall time of a `--resume` run after a kill half-way, over that of an uninterrupted run, start-up
     (TensorFlow, model, fingerprints) included [<= 0.6]. Input: the first --resume-lines GMB news sentences
     (bench/sentences.py); --shard-tokens is a tenth of its tokens, so ten shards; the killed run is stopped with
     `kill -9` right after its fifth shard is on the disk (ELMO_TF_FAULT=shard:5:SIGKILL, elmo_tf/io/journal.py: the
     same moment every time); the resumed output is checked bitwise against the uninterrupted one. The start-up
     alone (a one-line input) is reported beside it.
  2. float16: file size over float32's on the same input [<= 0.55], and the error of the float16 values against
     float32 (max abs, mean abs, max relative over |x| >= 1e-3), for the bench model on those sentences and for the
     AllenNLP test fixture weights (../shared/data/elmo_fixtures/allennlp) on the fixture's sentences; beside it,
     the error bfloat16 would give (float32 rounded to bfloat16 here, round to nearest even): why it is not offered.
  3. memory: peak RSS (`ru_maxrss` of the process, from `os.wait4`, through a small launcher process: see
     `common.run_measured`, a child's ru_maxrss starts at its exec'ing parent's peak) of embed over --rss-lines lines
     (the GMB sentences, repeated with a number in front: every line distinct), with `--layers top --dtype float16` to
     keep the disk small [100,000 within 10% of 1,000]. What grows is the format's own: sentence_to_index holds every
     line's key (one JSON string), and HDF5 keeps some metadata per dataset (measured apart, writing 100,000 small
     datasets after `import tensorflow`: +30 MiB without keys, +85 MiB with 90-byte keys, over 611 MiB).
Every run is a subprocess: `python -m elmo_tf embed --threads T ...` with random weights of --config (seeded,
written once to bench/results/cache/<config>-seed<seed>/).

usage (run it alone on the machine: other load changes the times):
  .venv/bin/python bench/embed_resume.py                       # small model: about 20-30 minutes on 2 idle cores
  .venv/bin/python bench/embed_resume.py --smoke               # tiny model, small inputs: about 1.5 minutes idle
  [--config small] [--resume-lines 20000] [--rss-lines 1000,100000] [--threads 2] [--parts resume,fixture,rss]
  [--out PATH] [--check]
"""

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile

import numpy as np
from common import SHARED, ensure_weights, parse_list, result_fields, run_measured, write_result
from sentences import REPO, load_sentences, write_sentences

FIXTURES = os.path.join(SHARED, "data", "elmo_fixtures", "allennlp")
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "embed_resume.json")
DEFAULT_CACHE = os.path.join(REPO, "bench", "results", "cache")
TARGET_RESUME = 0.6
TARGET_SIZE = 0.55
TARGET_RSS = 1.10
TINY = dict(  # the smoke model (the tests' shape)
    char_embedding_dim=4, filters=((1, 4), (2, 8)), num_highway=1, lstm_dim=16, projection_dim=8, num_layers=2
)

log = logging.getLogger("embed_resume")


def embed(args, model, input_path, output, *extra, fault=None):
    """One `python -m elmo_tf embed` run with `model` (a directory of options.json + weights.hdf5, or a pair of
    paths): {wall_s, peak_rss_mib, cpu_s, rc}."""
    options, weights = (
        (os.path.join(model, "options.json"), os.path.join(model, "weights.hdf5")) if isinstance(model, str) else model
    )
    command = [sys.executable, "-m", "elmo_tf", "embed", "--options", options, "--weights", weights]
    command += ["--input", input_path, "--output", output, "--threads", str(args.threads), "--quiet", *extra]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("ELMO_TF_FAULT", None)
    if fault:
        env["ELMO_TF_FAULT"] = fault
    rc, _, err, wall, rss, cpu = run_measured(command, env=env)
    if rc != 0 and not fault:
        raise RuntimeError(f"embed failed ({rc}): {' '.join(command)}\n{err[-4000:]}")
    return {"wall_s": wall, "peak_rss_mib": rss, "cpu_s": cpu, "rc": rc}


def paired_datasets(path, reference):
    """`(name, array, reference array)` for every dataset of `reference` but sentence_to_index, one pair at a time:
    memory holds two datasets, whatever the files' sizes. A name missing from `path` raises KeyError."""
    import h5py

    with h5py.File(path, "r") as f, h5py.File(reference, "r") as g:
        for name in g:
            if name != "sentence_to_index":
                yield name, f[name][...], g[name][...]


def names_and_index(path):
    """The file's names (a set) and its sentence_to_index text (None without one)."""
    import h5py

    with h5py.File(path, "r") as f:
        return set(f), f["sentence_to_index"][0] if "sentence_to_index" in f else None


def to_bfloat16(x):
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


class ErrorStats:
    """Max abs, mean abs, max and mean relative error (over |exact| >= 1e-3) of rounded values, fed dataset by
    dataset."""

    def __init__(self):
        self.max_abs = self.max_rel = self.sum_abs = self.sum_rel = 0.0
        self.count = self.big = 0

    def add(self, rounded, exact):
        error = np.abs(rounded.astype(np.float64) - exact)
        big = np.abs(exact) >= 1e-3
        relative = error[big] / np.abs(exact[big])
        self.max_abs = max(self.max_abs, float(error.max(initial=0.0)))
        self.sum_abs += float(error.sum())
        self.count += error.size
        self.max_rel = max(self.max_rel, float(relative.max(initial=0.0)))
        self.sum_rel += float(relative.sum())
        self.big += relative.size

    def result(self):
        return {
            "max_abs": self.max_abs,
            "mean_abs": self.sum_abs / max(self.count, 1),
            "max_rel": self.max_rel,
            "mean_rel": self.sum_rel / max(self.big, 1),
        }


def rounding_errors(path16, path32):
    """Errors of the float16 file against the float32 one, and of bfloat16 rounding of the float32 values; read one
    dataset at a time (a 40,000-line file is ~3 GB of float32)."""
    stats = {"float16": ErrorStats(), "bfloat16": ErrorStats()}
    values, max_abs_value = 0, 0.0
    for _, half, single in paired_datasets(path16, path32):
        exact = single.astype(np.float64)
        values += exact.size
        max_abs_value = max(max_abs_value, float(np.abs(exact).max(initial=0.0)))
        stats["float16"].add(half.astype(np.float32), exact)
        stats["bfloat16"].add(to_bfloat16(single), exact)
    return {"values": values, "max_abs_value": max_abs_value, **{k: v.result() for k, v in stats.items()}}


def identical(path, reference):
    """Same dataset names, the same sentence_to_index, and every dataset equal in dtype and values."""
    if names_and_index(path) != names_and_index(reference):
        return False
    return all(a.dtype == b.dtype and np.array_equal(a, b) for _, a, b in paired_datasets(path, reference))


def bench_resume(args, model_dir, work):
    sentences = load_sentences(args.resume_lines, args.data)
    tokens = sum(len(s.split()) for s in sentences)
    source = write_sentences(sentences, os.path.join(work, "resume.txt"))
    one = write_sentences(sentences[:1], os.path.join(work, "one.txt"))
    shard_tokens = str(max(1, math.ceil(tokens / 10)))
    flags = ["--batch-size", str(args.batch_size), "--shard-tokens", shard_tokens]
    startup = embed(args, model_dir, one, os.path.join(work, "one.hdf5"), *flags)
    whole_path, resumed_path = os.path.join(work, "whole.hdf5"), os.path.join(work, "resumed.hdf5")
    whole = embed(args, model_dir, source, whole_path, *flags)
    log.info(
        "uninterrupted: %d lines, %d tokens in %.1f s (start-up alone %.1f s)",
        len(sentences),
        tokens,
        whole["wall_s"],
        startup["wall_s"],
    )
    killed = embed(args, model_dir, source, resumed_path, *flags, fault="shard:5:SIGKILL")
    if killed["rc"] != -9:
        raise RuntimeError(f"the run to kill ended with {killed['rc']}")
    resumed = embed(args, model_dir, source, resumed_path, *flags, "--resume")
    same = identical(resumed_path, whole_path)
    half16 = embed(args, model_dir, source, os.path.join(work, "half.hdf5"), *flags, "--dtype", "float16")
    sizes = {name: os.path.getsize(os.path.join(work, f"{name}.hdf5")) for name in ("whole", "half")}
    result = {
        "lines": len(sentences),
        "tokens": tokens,
        "shard_tokens": int(shard_tokens),
        "startup": startup,
        "uninterrupted": whole,
        "killed_half_way": killed,
        "resumed": resumed,
        "resume_ratio": resumed["wall_s"] / whole["wall_s"],
        "resumed_output_identical": same,
        "float16_run": half16,
        "float32_bytes": sizes["whole"],
        "float16_bytes": sizes["half"],
        "float16_size_ratio": sizes["half"] / sizes["whole"],
        "error_bench_model": rounding_errors(os.path.join(work, "half.hdf5"), whole_path),
    }
    log.info(
        "killed at half: %.1f s; --resume: %.1f s = %.2fx the uninterrupted run (target <= %.1f); identical: %s",
        killed["wall_s"],
        resumed["wall_s"],
        result["resume_ratio"],
        TARGET_RESUME,
        same,
    )
    log.info(
        "float16: %d / %d bytes = %.3fx (target <= %.2f)",
        sizes["half"],
        sizes["whole"],
        result["float16_size_ratio"],
        TARGET_SIZE,
    )
    for path in (whole_path, resumed_path, os.path.join(work, "half.hdf5")):
        os.remove(path)
    return result


def bench_fixture_error(args, work):
    if not os.path.isdir(FIXTURES):
        log.warning("no fixture weights at %s: skipping their float16 error", FIXTURES)
        return None
    with open(os.path.join(FIXTURES, "sentences.json"), encoding="utf-8") as f:
        lines = [s for batch in json.load(f) for s in batch]
    source = write_sentences(lines, os.path.join(work, "fixture.txt"))
    model = (os.path.join(FIXTURES, "options.json"), os.path.join(FIXTURES, "lm_weights.hdf5"))
    for dtype in ("float32", "float16"):
        embed(args, model, source, os.path.join(work, f"fixture-{dtype}.hdf5"), "--dtype", dtype)
    return rounding_errors(os.path.join(work, "fixture-float16.hdf5"), os.path.join(work, "fixture-float32.hdf5"))


def bench_rss(args, model_dir, work):
    result = {}
    for n in args.rss_lines:
        base = load_sentences(min(n, 40000), args.data)
        # all lines distinct (a repeat gets a number in front), as in a real corpus: sentence_to_index holds every key
        lines = [base[k] if k < len(base) else f"{k // len(base)} {base[k % len(base)]}" for k in range(n)]
        source = write_sentences(lines, os.path.join(work, f"rss-{n}.txt"))
        out = os.path.join(work, f"rss-{n}.hdf5")
        run = embed(
            args, model_dir, source, out, "--batch-size", str(args.batch_size), "--layers", "top", "--dtype", "float16"
        )
        run["lines"] = n
        result[str(n)] = run
        log.info("%d lines: peak RSS %.0f MiB in %.1f s", n, run["peak_rss_mib"], run["wall_s"])
        os.remove(out)
        os.remove(source)
    low, high = (result[str(n)]["peak_rss_mib"] for n in (min(args.rss_lines), max(args.rss_lines)))
    result["ratio"] = high / low
    log.info(
        "peak RSS %d lines / %d lines: %.3f (target <= %.2f)",
        max(args.rss_lines),
        min(args.rss_lines),
        result["ratio"],
        TARGET_RSS,
    )
    return result


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="small | medium | original | tiny (small; tiny with --smoke)")
    parser.add_argument("--resume-lines", type=int, default=None, help="lines of the resume run (20000)")
    parser.add_argument("--rss-lines", default=None, help="comma-separated line counts (1000,100000)")
    parser.add_argument("--batch-size", type=int, default=64, help="embed --batch-size (64)")
    parser.add_argument("--threads", type=int, default=2, help="embed --threads (2)")
    parser.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2,000 / 200,2,000 lines: under 2 minutes")
    parser.add_argument("--parts", default="resume,fixture,rss", help="what to measure (resume,fixture,rss)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results (bench/results/embed_resume.json)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    args.config = args.config or ("tiny" if args.smoke else "small")
    args.resume_lines = args.resume_lines or (2000 if args.smoke else 20000)
    args.rss_lines = parse_list(args.rss_lines or ("200,2000" if args.smoke else "1000,100000"), int, "--rss-lines")
    parts = set(parse_list(args.parts, str, "--parts"))
    if not parts or parts - {"resume", "fixture", "rss"}:
        raise SystemExit(f"--parts: resume, fixture or rss, comma-separated; got {args.parts!r}")
    model_dir = os.path.join(DEFAULT_CACHE, f"{args.config}-seed{args.seed}")
    os.makedirs(model_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="elmo_embed_resume_")
    load_before = os.getloadavg()
    try:
        tiny = args.config == "tiny"
        ensure_weights(model_dir, None if tiny else args.config, args.seed, TINY if tiny else None)
        result = {
            "config": args.config,
            "threads": args.threads,
            "batch_size": args.batch_size,
            "smoke": args.smoke,
            "resume": bench_resume(args, model_dir, work) if "resume" in parts else None,
            "error_fixture_weights": bench_fixture_error(args, work) if "fixture" in parts else None,
            "rss": bench_rss(args, model_dir, work) if "rss" in parts else None,
            **result_fields(load_before),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(args.out, result)
    resume, rss = result["resume"], result["rss"]
    print(f"| measure ({args.config}, {args.threads} threads) | value | target |")
    print("|---|---:|---:|")
    if resume:
        print(
            f"| --resume after a kill half-way / uninterrupted (wall, start-up included) | "
            f"{resume['resume_ratio']:.2f} ({resume['resumed']['wall_s']:.1f} / "
            f"{resume['uninterrupted']['wall_s']:.1f} s) | <= {TARGET_RESUME} |"
        )
        print(f"| resumed output bitwise identical | {resume['resumed_output_identical']} | True |")
        print(f"| float16 / float32 file size | {resume['float16_size_ratio']:.3f} | <= {TARGET_SIZE} |")
    for name, errors in (
        ("bench model", resume and resume["error_bench_model"]),
        ("fixture weights", result["error_fixture_weights"]),
    ):
        if errors:
            for dtype in ("float16", "bfloat16"):
                e = errors[dtype]
                print(
                    f"| {dtype} error, {name}: max abs / mean abs / max rel | {e['max_abs']:.2e} / "
                    f"{e['mean_abs']:.2e} / {e['max_rel']:.2e} | |"
                )
    if rss:
        print(
            f"| peak RSS {max(args.rss_lines)} / {min(args.rss_lines)} lines | {rss['ratio']:.3f} "
            f"({rss[str(max(args.rss_lines))]['peak_rss_mib']:.0f} / "
            f"{rss[str(min(args.rss_lines))]['peak_rss_mib']:.0f} MiB) | <= {TARGET_RSS} |"
        )
    missed = bool(
        resume
        and (
            resume["resume_ratio"] > TARGET_RESUME
            or not resume["resumed_output_identical"]
            or resume["float16_size_ratio"] > TARGET_SIZE
        )
    ) or bool(rss and rss["ratio"] > TARGET_RSS)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
