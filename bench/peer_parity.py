"""Stateless parity of `python -m elmo_tf embed --layers all` with AllenNLP's PyTorch ELMo (the peer).

Both tools run as subprocesses on the same sentences and weights, each with its own batching (ours:
length-sorted batches of --batch-size; the peer: corpus order, batches of --peer-batch-size), so the
comparison also checks that a sentence's vectors do not depend on its batch-mates. Every sentence
dataset is compared: max |ours - peer| per layer (token layer, LSTM layer 1, 2, ...).

Weight sets:
  fixture_allennlp  ../shared/data/elmo_fixtures/allennlp/{options.json,lm_weights.hdf5}
  fixture_bilm_tf   ../shared/data/elmo_fixtures/bilm_tf/model/{options.json,lm_weights.hdf5} (no skip connections)
                    AllenNLP refuses biLMs without residual connections ("We only support pretrained biLMs
                    with residual connections"), so this set is recorded as not comparable and the same
                    weights are compared with use_skip_connections switched on in both tools
                    ("fixture_bilm_tf+skip"); our no-skip path is checked against bilm-tf's recorded
                    outputs by tests/test_fixture_parity.py instead.
  random_<preset>   a randomly initialized `BiLMConfig` preset (default small: LSTM 1024 / projection 128),
                    written with `elmo_tf.models.save_elmo`: seeded Keras initializers, LSTM input and
                    projection kernels scaled by --lstm-scale (4) so the projection clip is reached now
                    and then (about 1% of layer-1 values) without saturating, every bias drawn from
                    N(0, 0.1). The orthogonal recurrent kernels stay unscaled (--recurrent-scale 1): scaled
                    by 3 they make the random LSTM expanding, and float32 rounding differences between
                    any two implementations then grow along the sentence (seen: 1e-6 at the start of a
                    150-token sentence, 9e-4 at its end), which measures the random model, not the code.
  trained_<dir>     --trained DIR: a biLM this project trained (training/pretrain.py writes options.json and
                    weights.hdf5 in the bilm-tf layout): AllenNLP loads it as it loads released weights

Sentences: the first --n-sentences lines of the natural-English corpus (bench/sentences.py), plus a few
edge cases (tokens over 48 bytes, multi-byte UTF-8 cut inside a character, the literal tokens <S> and
</S>, a one-token and a 150-token sentence) unless --no-edge-cases.

Pass: every max |diff| <= --tolerance (default 1e-4, absolute, float32 outputs of order 1).
Exit status 0 on pass, 1 on a parity failure, 2 when a tool cannot run.

usage: .venv/bin/python bench/peer_parity.py [--peer-python /tmp/allennlp-peer/bin/python]
       [--peer-script ../shared/peer/allennlp_embed.py] [--out bench/results/peer_parity.json]
The peer's virtualenv comes from `bash ../shared/peer/setup_allennlp.sh /tmp/allennlp-peer`.
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from common import DEFAULT_PEER_PYTHON, DEFAULT_PEER_SCRIPT, SHARED, result_fields, write_result
from sentences import REPO, load_sentences, write_sentences

FIXTURES = os.path.join(SHARED, "data", "elmo_fixtures")
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "peer_parity.json")
TOLERANCE = 1e-4
BIAS_STD = 0.1
PEER_NO_RESIDUAL = "We only support pretrained biLMs with residual connections"

log = logging.getLogger("peer_parity")


def edge_case_sentences(natural):
    """Sentences that exercise the char mapping and long inputs (all with ASCII-space tokenization)."""
    long_sentence = " ".join(" ".join(natural).split()[:150])
    return [
        "Supercalifragilisticexpialidocious-antidisestablishmentarianism-pneumonoultramicroscopic words .",
        "a" + "\u00e9" * 30 + " na\u00efve caf\u00e9 \u201cquoted\u201d \u6771\u4eac\u90fd \U0001f600 \u2014 end",
        "<S> the boundary tokens </S> as plain text </S> <S>",
        "Hello",
        long_sentence,
    ]


def write_random_weights(output_dir, preset, seed, lstm_scale, recurrent_scale):
    """Writes options.json + weights.hdf5 of a random `preset` model (runs in our virtualenv)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from elmo_tf.config import get_config
    from elmo_tf.models import save_elmo
    from elmo_tf.models.elmo import ELMo

    keras.utils.set_random_seed(seed)
    model = ELMo(get_config(preset))
    rng = np.random.default_rng(seed)
    for var in model.weights:
        value = np.asarray(var.numpy())
        name = var.path
        if "bias" in name.rsplit("/", 1)[-1]:
            value = rng.normal(0.0, BIAS_STD, value.shape)
        elif "lstm" in name and name.endswith("recurrent_kernel"):
            value = value * recurrent_scale
        elif "lstm" in name and "kernel" in name:
            value = value * lstm_scale
        var.assign(value.astype(np.float32))
    save_elmo(model, output_dir)


def run_tool(name, command, cwd):
    """Runs one embedding tool; returns its wall time. Raises RuntimeError with its stderr on failure."""
    log.info("%s: %s", name, " ".join(command))
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed with exit status {proc.returncode}:\n{proc.stderr[-4000:]}")
    lines = [line for line in proc.stderr.splitlines() if "tokens" in line and "/s" in line]
    if lines:
        log.info("%s: %s", name, lines[-1].strip())
    return seconds


def compare(ours_path, peer_path, n_sentences, clip=None):
    """Per layer: max and mean |ours - peer| over all sentences, the worst sentence, and the scale of the
    peer's values. Returns (layers, problems) where problems lists missing datasets or shape mismatches."""
    layers, problems = None, []
    with h5py.File(ours_path, "r") as ours, h5py.File(peer_path, "r") as peer:
        for i in range(n_sentences):
            key = str(i)
            if key not in ours or key not in peer:
                problems.append(f"sentence {i}: missing in {'ours' if key not in ours else 'peer'}")
                continue
            a, b = ours[key][...], peer[key][...]
            if a.shape != b.shape:
                problems.append(f"sentence {i}: shape ours {a.shape} vs peer {b.shape}")
                continue
            if layers is None:
                layers = [
                    dict(
                        layer=k,
                        max_abs_diff=0.0,
                        worst_sentence=None,
                        sum_abs_diff=0.0,
                        count=0,
                        max_abs_value=0.0,
                        sum_sq=0.0,
                        at_clip=0,
                    )
                    for k in range(a.shape[0])
                ]
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            for k, entry in enumerate(layers):
                d = float(diff[k].max()) if diff[k].size else 0.0
                if entry["worst_sentence"] is None or d > entry["max_abs_diff"]:
                    entry["max_abs_diff"], entry["worst_sentence"] = d, i
                entry["sum_abs_diff"] += float(diff[k].sum())
                entry["count"] += diff[k].size
                entry["max_abs_value"] = max(entry["max_abs_value"], float(np.abs(b[k]).max()))
                entry["sum_sq"] += float(np.square(b[k].astype(np.float64)).sum())
                if clip:
                    entry["at_clip"] += int((np.abs(b[k]) >= clip * (1 - 1e-6)).sum())
    for entry in layers or []:
        count = max(entry.pop("count"), 1)
        entry["mean_abs_diff"] = entry.pop("sum_abs_diff") / count
        entry["rms_value"] = (entry.pop("sum_sq") / count) ** 0.5
        entry["fraction_abs_ge_proj_clip"] = entry.pop("at_clip") / count
    return layers or [], problems


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--peer-python", default=DEFAULT_PEER_PYTHON, help=f"python of the AllenNLP venv ({DEFAULT_PEER_PYTHON})"
    )
    parser.add_argument("--peer-script", default=DEFAULT_PEER_SCRIPT, help="the peer's embed script")
    parser.add_argument("--python", default=sys.executable, help="python with elmo_tf installed (this one)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results (bench/results/peer_parity.json)")
    parser.add_argument("--n-sentences", type=int, default=300, help="natural sentences (300)")
    parser.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    parser.add_argument("--no-edge-cases", action="store_true", help="natural sentences only")
    parser.add_argument(
        "--weight-sets",
        default="fixture_allennlp,fixture_bilm_tf,random",
        help="comma-separated subset of fixture_allennlp, fixture_bilm_tf, random",
    )
    parser.add_argument(
        "--trained",
        metavar="DIR",
        action="append",
        default=[],
        help="also compare a biLM we trained: DIR holds options.json and weights.hdf5 (a training/pretrain.py "
        "output dir); repeatable",
    )
    parser.add_argument("--random-preset", default="small", help="BiLMConfig preset of the random model (small)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model (0)")
    parser.add_argument(
        "--lstm-scale", type=float, default=4.0, help="factor on the random LSTM input and projection kernels (4.0)"
    )
    parser.add_argument(
        "--recurrent-scale", type=float, default=1.0, help="factor on the random (orthogonal) recurrent kernels (1.0)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="our batch size, length-sorted (64)")
    parser.add_argument("--peer-batch-size", type=int, default=32, help="peer batch size, corpus order (32)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both tools (2)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help=f"max |diff| allowed ({TOLERANCE})")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder with both outputs")
    parser.add_argument("--write-random-weights", metavar="DIR", help=argparse.SUPPRESS)
    return parser


def weight_sets_of(args, wanted, work):
    """`(name, options.json, weights)` of each weight set to compare: the fixtures in `wanted`, each --trained DIR,
    and the random model (written into `work` by a subprocess) when `wanted`. ValueError naming a --trained DIR
    without its files."""
    weight_sets = []
    for name, folder in (("fixture_allennlp", ("allennlp",)), ("fixture_bilm_tf", ("bilm_tf", "model"))):
        if name in wanted:
            d = os.path.join(FIXTURES, *folder)
            weight_sets.append((name, os.path.join(d, "options.json"), os.path.join(d, "lm_weights.hdf5")))
    for d in args.trained:
        files = [os.path.join(d, name) for name in ("options.json", "weights.hdf5")]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise ValueError(f"--trained: no {', '.join(map(repr, missing))}")
        weight_sets.append((f"trained_{os.path.basename(os.path.normpath(d))}", *files))
    if "random" in wanted:
        d = os.path.join(work, f"random_{args.random_preset}")
        flags = ("--random-preset", args.random_preset, "--seed", str(args.seed), "--lstm-scale", str(args.lstm_scale))
        command = [args.python, os.path.abspath(__file__), "--write-random-weights", d, *flags]
        subprocess.run([*command, "--recurrent-scale", str(args.recurrent_scale)], check=True, cwd=REPO)
        weight_sets.append(
            (f"random_{args.random_preset}", os.path.join(d, "options.json"), os.path.join(d, "weights.hdf5"))
        )
    return weight_sets


def run_both(args, options, weights, input_path, ours_out, peer_out):
    """Embeds `input_path` with both tools (ours length-sorted, the peer in corpus order); their seconds."""
    model = ["--options", options, "--weights", weights, "--input", input_path]
    ours = [args.python, "-m", "elmo_tf", "embed", *model, "--output", ours_out, "--layers", "all"]
    t_ours = run_tool("ours", [*ours, "--batch-size", str(args.batch_size), "--threads", str(args.threads)], REPO)
    peer = [args.peer_python, args.peer_script, *model, "--output", peer_out]
    t_peer = run_tool("peer", [*peer, "--batch-size", str(args.peer_batch_size), "--threads", str(args.threads)], REPO)
    return t_ours, t_peer


def with_skip_connections(name, options, weights, work):
    """The weight set `name` with use_skip_connections switched on (its options.json rewritten into `work`)."""
    variant = os.path.join(work, f"{name}_with_skip")
    os.makedirs(variant)
    with open(options, encoding="utf-8") as f:
        all_options = json.load(f)
    all_options["lstm"]["use_skip_connections"] = True
    with open(os.path.join(variant, "options.json"), "w", encoding="utf-8") as f:
        json.dump(all_options, f)
    return f"{name}+skip", os.path.join(variant, "options.json"), weights


def compare_weight_sets(args, weight_sets, work, input_path, n_sentences):
    """Per weight set, both tools' outputs compared (`compare`) against --tolerance; a set the peer refuses for its
    missing residual connections is recorded as such and compared with them switched on in both tools instead.
    RuntimeError or CalledProcessError when a tool cannot run."""
    results = {}
    for name, options, weights in weight_sets:  # grows by the "+skip" sets
        with open(options, encoding="utf-8") as f:
            lstm_options = json.load(f)["lstm"]
        ours_out, peer_out = os.path.join(work, f"ours_{name}.hdf5"), os.path.join(work, f"peer_{name}.hdf5")
        entry = {"options": options, "weights": weights, "lstm": lstm_options}
        try:
            t_ours, t_peer = run_both(args, options, weights, input_path, ours_out, peer_out)
        except RuntimeError as e:
            if PEER_NO_RESIDUAL not in str(e) or lstm_options.get("use_skip_connections"):
                raise
            log.warning("peer: %s; comparing %s with use_skip_connections=true instead", PEER_NO_RESIDUAL, name)
            results[name] = dict(entry, passed=None, peer_unsupported=f"AllenNLP: {PEER_NO_RESIDUAL}")
            weight_sets.append(with_skip_connections(name, options, weights, work))
            continue
        layers, problems = compare(ours_out, peer_out, n_sentences, lstm_options.get("proj_clip"))
        worst = max((layer["max_abs_diff"] for layer in layers), default=float("inf"))
        results[name] = dict(
            entry,
            layers=layers,
            problems=problems[:20],
            n_problems=len(problems),
            max_abs_diff=worst,
            passed=not problems and bool(layers) and worst <= args.tolerance,
            seconds_ours=t_ours,
            seconds_peer=t_peer,
        )
    return results


def print_results(args, results, n_sentences, n_tokens):
    """Per weight set and layer: max and mean |diff|, the worst sentence, the peer's values' scale, ok or FAIL."""
    print(
        f"\nparity of elmo_tf embed vs AllenNLP: {n_sentences} sentences, {n_tokens} tokens, "
        f"tolerance max |diff| <= {args.tolerance:g}"
    )
    print(
        f"{'weights':<22} {'layer':>5} {'max |diff|':>11} {'mean |diff|':>11} {'worst sent':>10} "
        f"{'max |peer|':>10} {'rms peer':>9} {'|v|>=clip':>8}  result"
    )
    for name, r in results.items():
        if r.get("peer_unsupported"):
            print(f"{name:<22} {'-':>5} {'peer cannot run it: ' + r['peer_unsupported']}")
        for entry in r.get("layers", []):
            print(
                f"{name:<22} {entry['layer']:>5} {entry['max_abs_diff']:>11.3e} {entry['mean_abs_diff']:>11.3e} "
                f"{entry['worst_sentence']:>10} {entry['max_abs_value']:>10.4f} {entry['rms_value']:>9.4f} "
                f"{entry['fraction_abs_ge_proj_clip']:>8.2%}  "
                f"{'ok' if entry['max_abs_diff'] <= args.tolerance else 'FAIL'}"
            )
        for problem in r.get("problems", []):
            print(f"{name:<22} problem: {problem}")


def check_tools(args):
    """The weight sets asked for; ValueError naming the flag when a tool is missing or a set unknown."""
    for path, flag in ((args.peer_python, "--peer-python"), (args.peer_script, "--peer-script")):
        if not os.path.isfile(path):
            raise ValueError(f"{flag}: no such file: {path!r} (run ../shared/peer/setup_allennlp.sh)")
    wanted = [w.strip() for w in args.weight_sets.split(",") if w.strip()]
    unknown = set(wanted) - {"fixture_allennlp", "fixture_bilm_tf", "random"}
    if unknown:
        raise ValueError(f"--weight-sets: unknown {sorted(unknown)}")
    return wanted


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    if args.write_random_weights:
        write_random_weights(
            args.write_random_weights, args.random_preset, args.seed, args.lstm_scale, args.recurrent_scale
        )
        return 0
    natural = load_sentences(args.n_sentences, args.data)
    sentences = natural + ([] if args.no_edge_cases else edge_case_sentences(natural))
    n_tokens = sum(len(s.split()) for s in sentences)
    work = tempfile.mkdtemp(prefix="elmo_peer_parity_")
    try:
        wanted = check_tools(args)
        input_path = write_sentences(sentences, os.path.join(work, "sentences.txt"))
        log.info(
            "%d sentences (%d edge cases), %d tokens; work dir %s",
            len(sentences),
            len(sentences) - len(natural),
            n_tokens,
            work,
        )
        results = compare_weight_sets(args, weight_sets_of(args, wanted, work), work, input_path, len(sentences))
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            log.info("kept %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_results(args, results, len(sentences), n_tokens)
    passed = all(r["passed"] is not False for r in results.values())
    report = {
        "tolerance": args.tolerance,
        "n_sentences": len(sentences),
        "n_edge_cases": len(sentences) - len(natural),
        "n_tokens": n_tokens,
        "data": args.data or "default (bench/sentences.py)",
        "batch_size_ours": args.batch_size,
        "batch_size_peer": args.peer_batch_size,
        "order_ours": "length-sorted",
        "order_peer": "corpus",
        "threads": args.threads,
        "random_model": {
            "preset": args.random_preset,
            "seed": args.seed,
            "lstm_scale": args.lstm_scale,
            "recurrent_scale": args.recurrent_scale,
            "bias_std": BIAS_STD,
        },
        **result_fields(),
        "passed": passed,
        "weight_sets": results,
    }
    print(f"\n{'PASS' if passed else 'FAIL'}")
    write_result(args.out, report)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
