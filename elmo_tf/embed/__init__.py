"""Embedding many sentences with an `ELMo` model: packed rows, token vectors computed once per batch, streamed.

The library side of `python -m elmo_tf embed`; nothing here prints. Modules, from the bottom up:
    `packing`   rows and batches: pack_rows (best fit), group_rows, iter_batches / plan_batches, iter_plan (the one
                order a run follows), packed_layout (a batch as the arrays the model runs); no TensorFlow
    `backend_functions`  the Embedder's two model functions on each Keras backend (`tf.function`s; `jax.jit`;
                PyTorch eager)
    `embedder`  Embedder: the model on packed rows, each distinct token through the char CNN once per batch (memo,
                token cache); on every Keras backend
    `malloc`    glibc's malloc for long runs: limit_malloc_arenas, release_free_memory; no TensorFlow
    `output`    the output file: check_dtype, cast_embedding (float32 or float16), write_embedding_file,
                merge_shards, merged_sentence_index; no TensorFlow
    `run`       embed_sentences (a stream of sentences, as a run batches them), embed_file (a whole file, journaled in
                shards and resumable), run_fingerprint

Names are imported on first access (`elmo_tf._lazy`), so `import elmo_tf.embed` loads no TensorFlow, nor do its
`packing`, `malloc` and `output` modules.
"""

from elmo_tf import _lazy

_names, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.embed.packing": (
            "BOUNDARIES",
            "ROW_LENGTH",
            "group_rows",
            "iter_batches",
            "iter_plan",
            "pack_rows",
            "packed_layout",
            "plan_batches",
            "release_free_memory",
        ),
        "elmo_tf.embed.embedder": ("Embedder", "LAYER_CHOICES"),
        "elmo_tf.embed.malloc": ("limit_malloc_arenas", "release_free_memory"),
        "elmo_tf.embed.output": (
            "DTYPES",
            "cast_embedding",
            "check_dtype",
            "merge_shards",
            "merged_sentence_index",
            "write_embedding_file",
        ),
        "elmo_tf.embed.run": ("FINGERPRINT_SHOWN", "SHARD_TOKENS", "embed_file", "embed_sentences", "run_fingerprint"),
        "elmo_tf.embed.score": ("ScoreError", "score_file", "scorer"),
    },
)
# `from elmo_tf.embed import *`, as before the package: BOUNDARIES and FINGERPRINT_SHOWN are importable by name only
__all__ = [
    "DTYPES",
    "Embedder",
    "LAYER_CHOICES",
    "ROW_LENGTH",
    "SHARD_TOKENS",
    "ScoreError",
    "cast_embedding",
    "check_dtype",
    "embed_file",
    "embed_sentences",
    "group_rows",
    "iter_batches",
    "iter_plan",
    "limit_malloc_arenas",
    "merge_shards",
    "merged_sentence_index",
    "pack_rows",
    "packed_layout",
    "plan_batches",
    "release_free_memory",
    "run_fingerprint",
    "score_file",
    "scorer",
    "write_embedding_file",
]
