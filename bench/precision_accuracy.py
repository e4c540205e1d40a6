"""The accuracy cost of `precision="bfloat16"` (issue 51): every ELMo layer computed in bfloat16 against float32, on
natural sentences, with the original model's shapes.

Spec: the original-size architecture (93.6M parameters) with the random weights bench/embed_throughput.py uses
(`ensure_weights`: seeded, written once into bench/results/cache/<preset>-seed<seed>/), or a released model's
`--options`/`--weights`; --n-sentences held-out WikiText-2 sentences (../shared/data/wikitext-2/test.txt: its
paragraphs split at " . ", headings left out, 3 to 60 tokens each), embedded with `Embedder(model, "all")` (packed
rows, as `elmo-tf embed` runs) by a float32 model and by a bfloat16 one loaded from the same files. Per layer (the
token layer, each LSTM layer, and their average, which a task's mix with equal weights sees) over every real token:
max |diff|, mean |diff|, the largest float32 magnitude (max |diff| as a fraction of it), and the cosine of each
token's bfloat16 vector with its float32 one (mean, and the lowest).

No timing: the speed of each precision is bench/embed_throughput.py's (`--precision float32,bfloat16`).

usage: .venv/bin/python bench/precision_accuracy.py [--n-sentences 400] [--batch-size 64] [--preset original]
       [--options options.json --weights weights.hdf5] [--quick] [--out bench/results/precision_accuracy.json]
"""

import argparse
import os
import sys
import time

import numpy as np
from common import CACHE, PTB_5M, REPO, RESULTS, ensure_weights, result_fields, set_threads, write_result

DEFAULT_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "wikitext-2", "test.txt"))
DEFAULT_OUT = os.path.join(RESULTS, "precision_accuracy.json")
MIN_TOKENS, MAX_TOKENS = 3, 60


def wikitext_sentences(path, n):
    """The first `n` sentences of a WikiText file: paragraphs (headings `= ... =` left out) split at " . ", each
    sentence given back its ".", kept with MIN_TOKENS to MAX_TOKENS tokens. ValueError when the file holds fewer."""
    sentences = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("="):
                continue
            for part in line.split(" . "):
                tokens = part.split()
                if tokens and tokens[-1] != ".":
                    tokens.append(".")
                if MIN_TOKENS <= len(tokens) <= MAX_TOKENS:
                    sentences.append(tokens)
                    if len(sentences) == n:
                        return sentences
    raise ValueError(f"{path} holds {len(sentences)} sentences of {MIN_TOKENS}-{MAX_TOKENS} tokens, fewer than {n}")


def embed_all(model, sentences, batch_size):
    """`(L+1, tokens, 2P)` float32: every layer of every real token of `sentences`, in order."""
    from elmo_tf.embed import Embedder

    embedder = Embedder(model, "all")
    arrays = []
    for start in range(0, len(sentences), batch_size):
        arrays.extend(embedder.embed_batch(sentences[start : start + batch_size]))
    return np.concatenate(arrays, axis=1)


def layer_stats(want, got):
    """max / mean |diff|, the largest float32 magnitude, max |diff| relative to it, and the cosine of each token's
    vector (mean, lowest) of `got` (bfloat16) against `want` (float32), both `(tokens, dim)`."""
    diff = np.abs(got.astype(np.float64) - want)
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
    cosine = np.sum(want.astype(np.float64) * got, axis=1) / np.maximum(norms, 1e-30)
    scale = float(np.abs(want).max())
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_float32": scale,
        "max_diff_of_scale": float(diff.max()) / scale if scale else 0.0,
        "mean_cosine": float(cosine.mean()),
        "min_cosine": float(cosine.min()),
    }


def compare(options, weights, sentences, batch_size):
    """Per layer `layer_stats` of a bfloat16 model against a float32 one loaded from `options` and `weights`."""
    from elmo_tf.models import load_elmo

    layers = {}
    for precision in ("float32", "bfloat16"):
        model = load_elmo(options, weights, precision=precision)
        layers[precision] = embed_all(model, sentences, batch_size)
        del model
    want, got = layers["float32"], layers["bfloat16"]
    names = ["token"] + [f"lstm_{k}" for k in range(1, len(want))]
    rows = {name: layer_stats(want[k], got[k]) for k, name in enumerate(names)}
    rows["average"] = layer_stats(want.mean(axis=0), got.mean(axis=0))
    return rows, int(want.shape[1])


def table(rows):
    head = f"{'layer':<9} {'max |diff|':>11} {'mean |diff|':>12} {'max |f32|':>10} {'max/scale':>10} {'mean cos':>10}"
    lines = [head + f" {'min cos':>10}"]
    for name, s in rows.items():
        lines.append(
            f"{name:<9} {s['max_abs_diff']:>11.5f} {s['mean_abs_diff']:>12.6f} {s['max_abs_float32']:>10.3f} "
            f"{s['max_diff_of_scale']:>10.5f} {s['mean_cosine']:>10.7f} {s['min_cosine']:>10.7f}"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-sentences", type=int, default=400, help="WikiText-2 test sentences (400)")
    parser.add_argument("--data", default=DEFAULT_DATA, help="a WikiText file (../shared/data/wikitext-2/test.txt)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per Embedder batch (64)")
    parser.add_argument("--preset", default="original", help="BiLMConfig preset of the random model (original)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    parser.add_argument("--options", help="a released model's options.json (with --weights) instead of random weights")
    parser.add_argument("--weights", help="its weights.hdf5")
    parser.add_argument("--threads", type=int, default=2, help="TensorFlow's threads (2)")
    parser.add_argument("--quick", action="store_true", help="a 5M-parameter model and 32 sentences: checks the script")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results (bench/results/precision_accuracy.json)")
    args = parser.parse_args(argv)
    if (args.options is None) != (args.weights is None):
        parser.error("--options and --weights go together")
    if args.n_sentences < 1 or args.batch_size < 1:
        parser.error("--n-sentences and --batch-size must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    set_threads(args.threads)
    model_name = "released" if args.options else ("ptb-5m" if args.quick else args.preset)
    if args.options:
        options, weights = args.options, args.weights
    elif args.quick:
        options, weights = ensure_weights(os.path.join(CACHE, f"ptb-5m-seed{args.seed}"), config=PTB_5M, seed=args.seed)
    else:
        options, weights = ensure_weights(os.path.join(CACHE, f"{args.preset}-seed{args.seed}"), args.preset, args.seed)
    n = 32 if args.quick else args.n_sentences
    sentences = wikitext_sentences(args.data, n)
    load_before, start = os.getloadavg(), time.time()
    rows, tokens = compare(options, weights, sentences, args.batch_size)
    print(f"bfloat16 against float32: {model_name} model, {len(sentences)} sentences, {tokens} tokens")
    print(table(rows))
    result = dict(
        result_fields(load_before),
        model=model_name,
        options=os.path.abspath(options),
        weights=os.path.abspath(weights),
        data=os.path.abspath(args.data),
        sentences=len(sentences),
        tokens=tokens,
        batch_size=args.batch_size,
        seconds=time.time() - start,
        layers=rows,
    )
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
