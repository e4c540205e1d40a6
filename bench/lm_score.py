"""Sentences scored per second by the biLM language model (`elmo-tf score`'s code path: `LanguageModel` +
`elmo_tf.embed.score.scorer`) at the original ELMo's shapes with an 800k-word softmax (random weights), beside `embed`'s
speed (`elmo_tf.embed.Embedder`, layers "all") on the same sentences, in one process with the same threads.

The softmax costs 2 directions x V x P multiply-adds per position (1.6 GFLOP at 800,000 x 512, about 8x the biLM's
0.2 GFLOP per token), computed --chunk-size words at a time (no positions x V array).

    python bench/lm_score.py --quick                   # small biLM, 20k words, 32 sentences: a minute
    python bench/lm_score.py                           # original shapes, 800k words, 200 sentences (run it alone)
    python bench/lm_score.py --top-k 10 --out bench/results/lm_score_top10.json

Writes a table to stdout and JSON to --out (bench/results/lm_score[_quick].json).
"""

import argparse
import os
import resource
import sys
import time

from common import result_fields, write_result  # bench/common.py, beside this script
from sentences import REPO, load_sentences


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small preset, 20,000 words, 32 sentences")
    p.add_argument("--preset", default=None, help="BiLMConfig preset (original; small with --quick)")
    p.add_argument("--vocab-size", type=int, default=None, help="softmax rows (800000; 20000 with --quick)")
    p.add_argument("--n-sentences", type=int, default=None, help="sentences (200; 32 with --quick)")
    p.add_argument("--data", default=None, help="sentence corpus (default: see bench/sentences.py)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch, both tools (32)")
    p.add_argument("--chunk-size", type=int, default=8192, help="softmax words per slice (8192)")
    p.add_argument("--top-k", type=int, default=0, help="top-k words per position too (0)")
    p.add_argument("--threads", type=int, default=2, help="TensorFlow intra/inter-op threads (2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    p.add_argument("--out", default=None, help="JSON results (bench/results/lm_score[_quick].json)")
    return p


def random_language_model(config, vocab_size, sentences, chunk_size, top_k, seed):
    """An `ELMo` with Keras's random initial weights and a `LanguageModel` sharing its biLM, whose softmax is
    N(0, 1/P) (bias 0) and whose vocabulary holds the corpus words (then fillers up to `vocab_size`)."""
    import keras
    import numpy as np

    from elmo_tf.models import ELMo, LanguageModel

    keras.utils.set_random_seed(seed)
    elmo = ELMo(config)
    words = ["<S>", "</S>", "<UNK>"]
    seen = set(words)
    for sentence in sentences:
        for word in sentence.split():
            if word not in seen and len(words) < vocab_size // 2:  # half the corpus words: OOV stays realistic
                seen.add(word)
                words.append(word)
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    lm = LanguageModel(config, vocab_size, top_k=top_k, chunk_size=chunk_size, bilm_layers=(elmo.char_cnn, elmo.bilm))
    rng = np.random.default_rng(seed)
    p = config.projection_dim
    for start in range(0, vocab_size, 65536):  # block by block: no second copy of the softmax
        block = rng.standard_normal((min(65536, vocab_size - start), p), dtype=np.float32) / np.float32(p**0.5)
        lm.softmax_kernel.value[start : start + len(block)].assign(block)
    lm.use_vocabulary(words)
    return elmo, lm


def time_embed(elmo, token_lists, batch_size):
    from elmo_tf.embed import Embedder, plan_batches

    embedder = Embedder(elmo, "all")
    batches = plan_batches([len(t) for t in token_lists], batch_size, 128 * batch_size, sort=False)
    embedder.embed_rows([[token_lists[i] for i in row] for row in batches[0]])  # warm-up (tracing)
    start = time.perf_counter()
    for batch in batches:
        embedder.embed_rows([[token_lists[i] for i in row] for row in batch])
    return time.perf_counter() - start


def time_score(lm, token_lists, batch_size):
    from elmo_tf.embed.score import scorer

    run = scorer(lm)
    run(token_lists[:batch_size])  # warm-up (tracing)
    start = time.perf_counter()
    for i in range(0, len(token_lists), batch_size):
        run(token_lists[i : i + batch_size])
    return time.perf_counter() - start


def main(argv=None):
    args = build_parser().parse_args(argv)
    preset = args.preset or ("small" if args.quick else "original")
    vocab_size = args.vocab_size or (20000 if args.quick else 800000)
    n = args.n_sentences or (32 if args.quick else 200)
    out_path = args.out or os.path.join(REPO, "bench", "results", f"lm_score{'_quick' if args.quick else ''}.json")
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from elmo_tf.config import get_config

    config = get_config(preset)
    sentences = load_sentences(n, args.data)
    token_lists = [s.encode().split() for s in sentences]
    tokens = sum(len(t) for t in token_lists)
    start = time.perf_counter()
    elmo, lm = random_language_model(config, vocab_size, sentences, args.chunk_size, args.top_k, args.seed)
    build_seconds = time.perf_counter() - start
    embed_seconds = time_embed(elmo, token_lists, args.batch_size)
    score_seconds = time_score(lm, token_lists, args.batch_size)
    positions = tokens + len(token_lists)  # n + 1 per sentence and direction
    softmax_flops = 2 * 2 * positions * vocab_size * config.projection_dim
    result = {
        "preset": preset,
        "vocab_size": vocab_size,
        "projection_dim": config.projection_dim,
        "sentences": len(token_lists),
        "tokens": tokens,
        "batch_size": args.batch_size,
        "chunk_size": args.chunk_size,
        "top_k": args.top_k,
        "threads": args.threads,
        "build_seconds": build_seconds,
        "embed": {"seconds": embed_seconds, "sentences_per_s": len(token_lists) / embed_seconds},
        "score": {
            "seconds": score_seconds,
            "sentences_per_s": len(token_lists) / score_seconds,
            "tokens_per_s": tokens / score_seconds,
            "softmax_gflop_per_s_lower_bound": softmax_flops / score_seconds / 1e9,
        },
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **result_fields(),
    }
    print(
        f"{preset} biLM, softmax {vocab_size} x {config.projection_dim}, {len(token_lists)} sentences ({tokens} tokens)"
    )
    print(f"{'tool':<28}{'seconds':>10}{'sentences/s':>14}")
    print(f"{'embed (layers all)':<28}{embed_seconds:>10.2f}{result['embed']['sentences_per_s']:>14.1f}")
    label = f"score (top-k {args.top_k})" if args.top_k else "score"
    print(f"{label:<28}{score_seconds:>10.2f}{result['score']['sentences_per_s']:>14.1f}")
    print(
        f"softmax {result['score']['softmax_gflop_per_s_lower_bound']:.0f} GFLOP/s (matmuls only), "
        f"peak RSS {result['max_rss_mib']:.0f} MiB"
    )
    write_result(out_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
