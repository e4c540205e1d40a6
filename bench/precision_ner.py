"""The tagging cost of `--precision bfloat16` (issue 51): CoNLL-2003 dev span F1 of NER taggers whose ELMo features
are computed in float32 and in bfloat16, side by side.

Spec: a pretraining run directory (`bench/pretrain_ptb.py`'s model or any `elmo-tf pretrain` output) and CoNLL-2003
(../shared/data/conll2003). Two taggers, the same head, settings and seed, trained by `training/train_ner.py` each in
its own process: one on float32 features (`--precision float32`), one on bfloat16 features (`--precision bfloat16`).
Then `elmo-tf tag` tags the dev sentences in its own process, from the model directory alone, three ways:
  - float32 tagger, float32 features: the reference (must equal the training run's own dev F1, a cross-check of the
    two code paths);
  - float32 tagger, bfloat16 features (`tag --precision bfloat16`): a tagger trained before switching to bfloat16;
  - bfloat16 tagger, bfloat16 features: a tagger trained and used in bfloat16.
F1 is conlleval's exact-match span F1 (`elmo_tf.ner.training.span_scores`) in the files' scheme. The budget: each
bfloat16 F1 at most 0.2 points below the reference. For scale, the same for a float32 tagger of another seed
(--noise-seed, on by default): how far two float32 taggers differ by their seed alone.

A tagger whose output directory already holds metrics.json is reused (delete --workdir to start over).

usage: .venv/bin/python bench/precision_ner.py --run RUN [--data ../shared/data] [--epochs 10] [--patience 3]
       [--seed 1] [--noise-seed 2] [--workdir /tmp/precision_ner] [--out bench/results/precision_ner.json]
"""

import argparse
import json
import os
import subprocess
import sys
import time

from common import REPO, RESULTS, SHARED, result_fields, write_result

from elmo_tf.io.conll import read_conll

DEFAULT_OUT = os.path.join(RESULTS, "precision_ner.json")
BUDGET = 0.2  # F1 points bfloat16 may lose against float32 (issue 51)
FILES = {"train": "eng.train", "dev": "eng.testa"}


def timed(command, log_path):
    """Runs `command` (stdout and stderr into `log_path`); its wall seconds. Exits naming the log on failure."""
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"precision_ner.py: {' '.join(command)} exited {done.returncode}; see {log_path}")
    return time.perf_counter() - start


def train(args, precision, seed):
    """The output directory of a tagger trained on `precision` features with `seed` (reused when finished), and the
    training's metrics.json with its wall seconds."""
    out = os.path.join(args.workdir, f"{precision}-seed{seed}")
    metrics_path = os.path.join(out, "metrics.json")
    if not os.path.exists(metrics_path):
        os.makedirs(out, exist_ok=True)
        command = [sys.executable, os.path.join(REPO, "training", "train_ner.py"), "--output", out]
        command += ["--train", os.path.join(args.data, "conll2003", FILES["train"])]
        command += ["--dev", os.path.join(args.data, "conll2003", FILES["dev"])]
        command += ["--elmo", args.run, "--precision", precision, "--seed", str(seed)]
        command += ["--epochs", str(args.epochs), "--patience", str(args.patience)]
        command += ["--cache", os.path.join(args.workdir, f"features-{precision}.hdf5")]
        print(f"[{time.strftime('%H:%M:%S')}] training on {precision} features, seed {seed} -> {out}", flush=True)
        seconds = timed(command, os.path.join(out, "train.log"))
        with open(os.path.join(out, "bench_time.json"), "w", encoding="utf-8") as f:
            json.dump({"wall_s": seconds}, f)
    with open(metrics_path, encoding="utf-8") as f:
        metrics = json.load(f)
    with open(os.path.join(out, "bench_time.json"), encoding="utf-8") as f:
        metrics["wall_s"] = json.load(f)["wall_s"]
    return out, metrics


def tag(args, tagger, precision, tokens_path):
    """The dev tags `elmo-tf tag` gives with `tagger` computing the features in `precision`, and its wall seconds."""
    output = os.path.join(args.workdir, f"tags-{os.path.basename(tagger)}-{precision}.conll")
    command = [os.path.join(os.path.dirname(sys.executable), "elmo-tf"), "tag", "--model", tagger]
    command += ["--elmo", args.run, "--precision", precision, "--input", tokens_path, "--quiet"]
    start = time.perf_counter()
    with open(output, "w", encoding="utf-8") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"precision_ner.py: {' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    seconds = time.perf_counter() - start
    sentences = [s.tags for s in read_conll(output)]  # `token<TAB>tag` lines, a blank line after each sentence
    return sentences, seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="pretraining run directory (options.json, weights.hdf5, vocab.txt)")
    p.add_argument("--data", default=os.path.join(SHARED, "data"), help="folder holding conll2003/")
    p.add_argument("--epochs", type=int, default=10, help="most epochs per tagger (early stopping on dev F1)")
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--seed", type=int, default=1, help="the seed of both taggers")
    p.add_argument("--noise-seed", type=int, default=2, help="a float32 tagger of this seed for scale (0: none)")
    p.add_argument("--workdir", default="/tmp/precision_ner", help="taggers, feature caches, tags (reused)")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON results")
    args = p.parse_args(argv)
    for flag, value in (("--epochs", args.epochs), ("--patience", args.patience)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if not os.path.isfile(os.path.join(args.run, "options.json")):
        p.error(f"--run: no options.json in {args.run!r} (a pretraining run directory)")
    dev_path = os.path.join(args.data, "conll2003", FILES["dev"])
    if not os.path.isfile(dev_path):
        p.error(f"--data: no {dev_path!r}")

    from elmo_tf.ner.training import span_scores

    load_before = os.getloadavg()
    os.makedirs(args.workdir, exist_ok=True)
    dev = read_conll(dev_path)
    gold = [s.tags for s in dev]
    tokens_path = os.path.join(args.workdir, "dev_tokens.txt")
    with open(tokens_path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(s.tokens) + "\n" for s in dev)

    taggers = {"float32": train(args, "float32", args.seed), "bfloat16": train(args, "bfloat16", args.seed)}
    if args.noise_seed:
        taggers["float32, another seed"] = train(args, "float32", args.noise_seed)
    ways = [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")]
    if args.noise_seed:
        ways.append(("float32, another seed", "float32"))
    rows = []
    for trained, features in ways:
        directory, metrics = taggers[trained]
        predicted, seconds = tag(args, directory, features, tokens_path)
        scores = span_scores(gold, predicted, "iob1")
        rows.append(
            dict(
                trained_on=trained,
                tagged_with=features,
                dev_f1=scores["f1"],
                precision=scores["precision"],
                recall=scores["recall"],
                per_type={k: v["f1"] for k, v in scores["per_type"].items()},
                training_dev_f1=metrics["dev"]["f1"],
                best_epoch=metrics["best_epoch"],
                train_wall_s=metrics["wall_s"],
                tag_wall_s=seconds,
            )
        )
    reference = rows[0]["dev_f1"]
    for row in rows:
        row["vs_reference"] = row["dev_f1"] - reference
    print(f"CoNLL-2003 dev ({len(gold):,} sentences) span F1, biLM {args.run}")
    print("| tagger trained on | features when tagging | dev F1 | vs float32 | training's own dev F1 | best epoch |")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['trained_on']} | {row['tagged_with']} | {row['dev_f1']:.2f} | {row['vs_reference']:+.2f} |"
            f" {row['training_dev_f1']:.2f} | {row['best_epoch']} |"
        )
    cross_check = abs(rows[0]["dev_f1"] - rows[0]["training_dev_f1"])
    worst = min(row["vs_reference"] for row in rows[1:3])
    within = worst >= -BUDGET
    print(f"tag's float32 F1 against training's own: {cross_check:.3f} apart")
    print(f"bfloat16's worst: {worst:+.2f} F1 (budget -{BUDGET}): {'within' if within else 'OVER'}")
    result = dict(
        result_fields(load_before),
        run=os.path.abspath(args.run),
        data=os.path.abspath(dev_path),
        settings={"epochs": args.epochs, "patience": args.patience, "seed": args.seed, "noise_seed": args.noise_seed},
        rows=rows,
        cross_check_f1_difference=cross_check,
        budget_f1=BUDGET,
        within_budget=within,
    )
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
