"""ELMo embedding on a CUDA GPU under JAX and PyTorch, without TensorFlow: tokens/s and the distance to the CPU.

Spec (issue 41): the original shapes (93.6M parameters; seeded random weights, the same numbers on every backend),
1,000 natural sentences (bench/sentences.py), batch 64 and 256, the biLM's matmuls in float32 and in bfloat16
(`ELMo(implementation="ops", matmul_dtype="bfloat16")`; the char CNN and the element-wise math stay float32), under
JAX (`jax.jit` of `stateless_call`, one program per padded shape) and PyTorch (eager, `torch.no_grad()`, the weights
on the GPU). Each run: one untimed pass over every batch (JAX compiles there), then a timed pass; every batch's
activations come back to the host as NumPy (what an embedding job keeps). Sentences are sorted by length and padded
to a multiple of 16 tokens. The max |diff| is taken over every layer of the first sentences' real tokens against the
outputs recorded on the CPU (`record`, here, under TensorFlow by default).

Two steps, because the GPU machine has no TensorFlow and no `../shared`:

    # here: the sentences, the weights' seed and the CPU's outputs into one file (about 25 MB, git-ignored)
    .venv/bin/python bench/gpu_embed.py record --out bench/results/gpu_embed/reference.npz
    # on the GPU machine (the repo's root; keras and its missing dependencies carried as wheels: bench/README.md)
    python3 bench/gpu_embed.py run --reference bench/results/gpu_embed/reference.npz --json $OUT/gpu_embed.json

`run --device cpu --n-sentences 40 --batch-sizes 8` checks the script on a CPU (bench/README.md: 2 minutes here).
Sized to finish within 8 minutes on an NVIDIA H200 (the JAX compiles dominate: 2 batch sizes x 2 dtypes x about 6
padded lengths).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
from common import (  # bench/common.py and sentences.py, beside this script
    REPO,
    RESULTS,
    compiled_activations,
    git_commit,
    padded_batches,
    write_result,
)
from sentences import load_sentences

BUCKET = 16
SEED = 0
BACKENDS = ("jax", "torch")
DTYPES = ("float32", "bfloat16")


def _model(preset, seed, matmul_dtype):
    """`ELMo` of `preset` with every weight drawn from a seeded NumPy generator in `weights` order (so every backend
    holds the same numbers): N(0, 1 / fan_in) for matrices and kernels, N(0, 0.01) for vectors."""
    from elmo_tf.config import get_config
    from elmo_tf.models import ELMo

    options = dict(implementation="ops", matmul_dtype=matmul_dtype) if matmul_dtype != "float32" else {}
    model = ELMo(get_config(preset), **options)
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        scale = 1.0 / np.sqrt(np.prod(shape[:-1])) if len(shape) >= 2 else 0.1
        variable.assign((rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32))
    return model


def worker(args):
    """One backend, in a process of its own (KERAS_BACKEND set): every batch size and dtype; prints one JSON line."""
    import keras

    backend = keras.config.backend()
    with np.load(args.reference) as data:
        sentences = json.loads(str(data["sentences"]))[: args.n_sentences]
        preset, seed = str(data["preset"]), int(data["seed"])
        reference = [data[f"layer{k}"] for k in range(int(data["layers"]))]
        reference_lengths = data["lengths"]
    device = args.device
    if backend == "torch":
        import torch

        device = "cuda" if device == "gpu" else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("error: --device gpu: PyTorch sees no CUDA device")
        versions = {"torch": torch.__version__, "device_name": torch.cuda.get_device_name() if device == "cuda" else ""}
    else:
        import jax

        devices = jax.devices()
        if args.device == "gpu" and devices[0].platform != "gpu":
            raise SystemExit(f"error: --device gpu: JAX sees {devices}")
        versions = {"jax": jax.__version__, "device_name": str(devices[0].device_kind)}
    rows = []
    for dtype in args.dtypes.split(","):
        model = _model(preset, seed, dtype)
        run = compiled_activations(model, device)
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            batches = padded_batches(model.char_mapping, sentences, batch_size, BUCKET)
            start = time.perf_counter()
            for _, ids in batches:
                run(ids)
            warmup = time.perf_counter() - start
            outputs = {}
            start = time.perf_counter()
            for batch, ids in batches:
                layers = run(ids)
                for row, i in enumerate(batch):
                    if i < len(reference_lengths):
                        outputs[i] = [layer[row] for layer in layers]
            seconds = time.perf_counter() - start
            tokens = sum(len(s) for s in sentences)
            worst = max(
                float(np.abs(outputs[i][k][:n] - reference[k][i, :n]).max())
                for i, n in enumerate(reference_lengths)
                if i in outputs
                for k in range(len(reference))
            )
            rows.append(
                dict(
                    backend=backend,
                    dtype=dtype,
                    batch_size=batch_size,
                    tokens=tokens,
                    seconds=seconds,
                    tokens_per_s=tokens / seconds,
                    warmup_seconds=warmup,
                    max_abs_diff_vs_cpu=worst,
                    batches=len(batches),
                    shapes=len({ids.shape for _, ids in batches}),
                )
            )
            print(f"{backend} {dtype} batch {batch_size}: {tokens / seconds:.0f} tokens/s", file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "versions": versions, "keras": keras.__version__}))


def record(args):
    """Writes the reference: the sentences, the weights' preset and seed, and every layer of the first sentences."""
    import keras

    sentences = [s.split() for s in load_sentences(args.n_sentences, args.data)]
    model = _model(args.preset, SEED, "float32")
    first = sentences[: args.reference_sentences]
    order, char_ids = padded_batches(model.char_mapping, first, len(first), BUCKET)[0]
    layers = [keras.ops.convert_to_numpy(a) for a in model(char_ids)["activations"]]
    inverse = np.argsort(order)  # rows back in sentence order
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez(
        args.out,
        sentences=json.dumps(sentences),
        preset=args.preset,
        seed=SEED,
        layers=len(layers),
        lengths=np.array([len(s) for s in first]),
        backend=keras.config.backend(),
        **{f"layer{k}": layer[inverse] for k, layer in enumerate(layers)},
    )
    print(f"wrote {args.out}: {len(sentences)} sentences, {len(first)} recorded on {keras.config.backend()}")


def run(args):
    """Runs `worker` under each backend; prints the table and writes the JSON."""
    results, started = [], time.perf_counter()
    for backend in args.backends.split(","):
        path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))  # elmo_tf from this checkout
        env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=path)
        command = [sys.executable, os.path.abspath(__file__), "worker", "--reference", args.reference]
        command += ["--n-sentences", str(args.n_sentences), "--batch-sizes", args.batch_sizes]
        command += ["--dtypes", args.dtypes, "--device", args.device]
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(f"error: the {backend} worker failed (exit {done.returncode})")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [row for result in results for row in result["rows"]]
    print(f"\nELMo embedding, original shapes, {rows[0]['tokens']} tokens, sorted, padded to {BUCKET}; {args.device}")
    print(f"{'backend':<8} {'dtype':<9} {'batch':>5} {'tokens/s':>10} {'warm-up s':>9} {'max |diff| vs CPU':>18}")
    for row in rows:
        print(
            f"{row['backend']:<8} {row['dtype']:<9} {row['batch_size']:>5} {row['tokens_per_s']:>10.0f} "
            f"{row['warmup_seconds']:>9.1f} {row['max_abs_diff_vs_cpu']:>18.2e}"
        )
    versions = {k: v for result in results for k, v in result["versions"].items()}
    print(f"versions: keras {results[0]['keras']}, {versions}; {time.perf_counter() - started:.0f} s in all")
    if args.json:
        # not common.result_fields: its CPU description imports elmo_tf, which this process (on the GPU machine,
        # PYTHONPATH the carried wheels only) cannot; the device is in `versions`
        report = dict(rows=rows, versions=versions, keras=results[0]["keras"], device=args.device)
        report.update(platform=platform.platform(), seconds=time.perf_counter() - started)
        report.update(git_commit=git_commit(REPO), date=time.strftime("%Y-%m-%d"))
        write_result(args.json, report)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="the CPU's reference outputs (here)")
    rec.add_argument("--out", default=os.path.join(RESULTS, "gpu_embed", "reference.npz"))
    rec.add_argument("--n-sentences", type=int, default=1000)
    rec.add_argument("--reference-sentences", type=int, default=32, help="sentences whose outputs are kept (32)")
    rec.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    rec.add_argument("--preset", default="original")
    for name in ("run", "worker"):
        p = sub.add_parser(name, help="the measurement (on the GPU machine)" if name == "run" else argparse.SUPPRESS)
        p.add_argument("--reference", required=True, help="the file `record` wrote")
        p.add_argument("--n-sentences", type=int, default=1000)
        p.add_argument("--batch-sizes", default="64,256")
        p.add_argument("--dtypes", default=",".join(DTYPES))
        p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
        if name == "run":
            p.add_argument("--backends", default=",".join(BACKENDS))
            p.add_argument("--json", default=None, help="where to write the results (JSON)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    {"record": record, "run": run, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
