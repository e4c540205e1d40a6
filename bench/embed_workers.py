"""The measurements of bench/embed_throughput.py, each in its own process: the worker modes (`common.run_worker`):
`ours` times elmo_tf's Embedder, `plain` times `ELMo` itself on the process's Keras backend, `cache` builds the +cache
row's token-embedding file, `matmul` measures the roofline (`common.worker_matmul`), each returning the dict the
worker writes as its result; and `run_peer`, AllenNLP's run. A worker given `--precision bfloat16` loads the model
with it (`load_elmo(..., precision=)`, `Embedder(..., precision=)`); float32 passes nothing, so a tree from before the
setting runs too."""

import os
import re
import resource
import time

from common import compiled_activations, padded_batches, run_watched, set_threads, worker_matmul

PEER_LINE = re.compile(r"(\d+) tokens in ([0-9.]+) s: ([0-9.]+) tokens/s")


def run_peer(args, input_path, batch_size, order, work):
    """AllenNLP's embedding of `input_path` (../shared/peer/allennlp_embed.py in its own venv, `--sort` for
    length-sorted batches): its tokens/s (model loading and one warm-up batch excluded, by the script), the process's
    peak RSS, CPU and `foreign_cpu_share`. RuntimeError with its stderr when it fails."""
    output = os.path.join(work, "peer_out.hdf5")
    command = [args.peer_python, args.peer_script, "--options", os.path.join(args.weights_dir, "options.json")]
    command += ["--weights", os.path.join(args.weights_dir, "weights.hdf5"), "--input", input_path]
    command += ["--output", output, "--batch-size", str(batch_size), "--threads", str(args.threads)]
    if order == "sorted":
        command.append("--sort")
    try:
        run = run_watched(command)
    finally:
        if os.path.exists(output):
            os.remove(output)
    match = PEER_LINE.search(run["stderr"])
    if run["rc"] != 0 or not match:
        raise RuntimeError(f"peer failed with exit status {run['rc']}:\n{run['stderr'][-4000:]}")
    tokens, seconds, _ = match.groups()
    return {
        "tokens": int(tokens),
        "seconds": float(seconds),
        "tokens_per_s": int(tokens) / float(seconds),
        "process_seconds": run["wall"],
        "peak_rss_mib": run["rss"],
        "cpu_seconds": run["cpu"],
        "cpu_utilization": run["cpu"] / run["wall"],
        "foreign_cpu_share": run["foreign_cpu_share"],
    }


def _precision(args):
    """`load_elmo`'s keyword arguments for the worker's `--precision` (none for float32)."""
    precision = getattr(args, "precision", None) or "float32"
    return {} if precision == "float32" else {"precision": precision}


def worker_cache(args):
    """Builds the +cache row's token-embedding file: a vocabulary of the words seen at least twice in
    --cache-vocab-from (whitespace tokens), dumped with elmo_tf.io.token_embeddings."""
    set_threads(args.threads)
    from collections import Counter

    from elmo_tf.io.token_embeddings import compute_token_embeddings, write_token_embeddings
    from elmo_tf.models import load_elmo

    counts = Counter()
    for path in args.cache_vocab_from.split(","):
        with open(path, "rb") as f:
            for line in f:
                counts.update(line.split())
    vocabulary = sorted((t for t, n in counts.items() if n >= 2), key=lambda t: (-counts[t], t))
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), os.path.join(args.weights_dir, "weights.hdf5"))
    start = time.perf_counter()
    embedding = compute_token_embeddings(model, vocabulary)
    seconds = time.perf_counter() - start
    with open(args.cache_vocab, "wb") as f:
        f.write(b"".join(t + b"\n" for t in vocabulary))
    write_token_embeddings(args.cache_file, embedding, vocabulary=vocabulary)
    return {"vocabulary": len(vocabulary), "dump_seconds": seconds}


def worker_ours(args):
    """Times elmo_tf's Embedder over the sentences on the Keras backend of this process (`KERAS_BACKEND`): model
    loading and one warm-up batch excluded (under JAX, which compiles once per padded shape, a warm-up pass over every
    batch, the memo emptied after it)."""
    backend = _backend_threads(args.threads)
    from elmo_tf.embed import Embedder, limit_malloc_arenas, plan_batches

    limit_malloc_arenas()  # as `python -m elmo_tf embed` does
    from elmo_tf.io.sentences import iter_sentences
    from elmo_tf.models import load_elmo

    start = time.perf_counter()
    precision = _precision(args)
    weights = os.path.join(args.weights_dir, "weights.hdf5")
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), weights, **precision)
    token_embeddings = None
    if args.cache_file:
        from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary

        vocabulary = read_vocabulary(args.cache_vocab)
        token_embeddings = vocabulary, load_token_embeddings(args.cache_file, vocabulary)
    memo = {} if args.memo_size is None else {"memo_size": args.memo_size}
    embedder = Embedder(model, "all", token_embeddings=token_embeddings, **memo, **precision)
    token_embeddings_rows = set(token_embeddings[0]) if token_embeddings else set()
    load_seconds = time.perf_counter() - start
    sentences = [s.tokens for s in iter_sentences(args.input)]
    lengths = [len(s) for s in sentences]
    batches = plan_batches(lengths, args.batch_size, 128 * args.batch_size, sort=args.order == "sorted")
    start = time.perf_counter()
    for batch in batches if backend == "jax" else batches[:1]:
        embedder.embed_rows([[sentences[i] for i in row] for row in batch])
    warmup_seconds = time.perf_counter() - start
    embedder.reset_memo()
    embedder.stats = dict.fromkeys(embedder.stats, 0)
    results = {}
    start = time.perf_counter()
    for batch in batches:
        order = [i for row in batch for i in row]
        for i, array in zip(order, embedder.embed_rows([[sentences[i] for i in row] for row in batch])):
            results[i] = array
    seconds = time.perf_counter() - start
    tokens = sum(lengths)
    if len(results) != sum(n > 0 for n in lengths):
        raise RuntimeError(f"embedded {len(results)} sentences, expected {sum(n > 0 for n in lengths)}")
    stats = embedder.stats
    return {
        "backend": backend,
        "tokens": tokens,
        "sentences": len(results),
        "batches": len(batches),
        "rows": sum(len(b) for b in batches),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "load_seconds": load_seconds,
        "warmup_seconds": warmup_seconds,
        "position_fill": stats["positions"] / max(stats["padded_positions"], 1),
        "distinct_per_token": stats["distinct"] / max(stats["tokens"], 1),
        "cache_hit_rate": stats["cached"] / max(stats["distinct"], 1),
        "cached_token_share": (
            sum(t in token_embeddings_rows for s in sentences for t in s) / tokens if token_embeddings else 0.0
        ),
        "max_rss_mib_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _backend_threads(threads):
    """This process's Keras backend, its thread pools set to `threads` (TensorFlow's and PyTorch's; XLA's CPU client
    takes every core the process may use)."""
    import keras

    backend = keras.config.backend()
    if backend == "tensorflow":
        set_threads(threads)
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)
    return backend


BUCKET = 8  # the plain worker pads each batch's length to a multiple of this: fewer shapes for JAX to compile


def worker_plain(args):
    """Times `ELMo` itself on the Keras backend of this process (`KERAS_BACKEND`): one padded sentence per row (no
    packing, no distinct-token encoding: the Embedder's are TensorFlow's), Python strings mapped in NumPy
    (`common.padded_batches`), compiled as each backend's users compile it (`common.compiled_activations`). Model
    loading and one warm-up pass excluded (JAX compiles once per padded shape: the warm-up pass runs every batch)."""
    backend = _backend_threads(args.threads)
    from elmo_tf.io.sentences import iter_sentences
    from elmo_tf.models import load_elmo

    start = time.perf_counter()
    weights = os.path.join(args.weights_dir, "weights.hdf5")
    model = load_elmo(os.path.join(args.weights_dir, "options.json"), weights, **_precision(args))
    load_seconds = time.perf_counter() - start
    run = compiled_activations(model)
    sentences = [s.tokens for s in iter_sentences(args.input)]
    sort = args.order == "sorted"
    batches = [ids for _, ids in padded_batches(model.char_mapping, sentences, args.batch_size, BUCKET, sort)]
    start = time.perf_counter()
    for ids in batches if backend == "jax" else batches[:1]:
        run(ids)
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for ids in batches:
        run(ids)  # the arrays in memory, as ours keeps them
    seconds = time.perf_counter() - start
    tokens = sum(map(len, sentences))
    return {
        "backend": backend,
        "precision": getattr(model, "precision", "float32"),
        "tokens": tokens,
        "sentences": len(sentences),
        "batches": len(batches),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "load_seconds": load_seconds,
        "warmup_seconds": warmup_seconds,
        "position_fill": tokens / sum(int(ids.shape[0] * ids.shape[1]) for ids in batches),
        "max_rss_mib_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


WORKERS = {
    "matmul": worker_matmul,
    "ours": worker_ours,
    "cache": worker_cache,
    "plain": worker_plain,
}
