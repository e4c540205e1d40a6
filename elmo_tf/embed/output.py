"""Embed's output file: the dtype of its arrays, one file written from `(Sentence, array)` pairs, shards merged.

An embed output (hdf5) holds one dataset per input line, named by the line's index ("0", "1", ...), and, unless turned
off, `sentence_to_index` (AllenNLP's map from a line's key to its dataset name); `elmo_tf.io.sentences.EmbeddingWriter`
writes it atomically. The arrays are computed in float32 and written as float32 or float16 (`check_dtype`,
`cast_embedding`). `write_embedding_file` writes any set of lines as a valid output of their own (a shard of
`embed_file`'s journal, a worker's share of a larger input), `merge_shards` joins such files into one.
"""

import json

import numpy as np

from elmo_tf.embed.malloc import release_free_memory
from elmo_tf.errors import ElmoTFError
from elmo_tf.io.embeddings_shards import PRECISION_ATTR, merged_index_text, write_shards
from elmo_tf.io.journal import fault_point
from elmo_tf.io.sentences import EmbeddingWriter, LineKeys, content_attrs

DTYPES = ("float32", "float16")  # of the written arrays; computed in float32 either way


def check_dtype(dtype):
    """`dtype` ("float32" or "float16", or their numpy dtypes) as its name; ElmoTFError naming it otherwise."""
    name = np.dtype(dtype).name if isinstance(dtype, (type, np.dtype)) else dtype
    if name not in DTYPES:
        raise ElmoTFError(f"dtype must be one of {DTYPES}, got {dtype!r}", key="dtype")
    return name


def output_attrs(max_sentence_tokens, precision):
    """The root attributes of an embed output (a file, a shard): how long lines were handled (`content_attrs`: split
    in pieces of `max_sentence_tokens`, None: no bound) and `PRECISION_ATTR`, the precision its arrays were computed
    in ("float32" or "bfloat16": the model's, `Embedder.precision`)."""
    return {**content_attrs(max_sentence_tokens, "split"), PRECISION_ATTR: str(precision)}


def cast_embedding(array, dtype, index=None):
    """`array` (float32) as `dtype`, rounded to the nearest; ElmoTFError when a finite value does not fit (float16's
    largest is 65504: ELMo's outputs stay far below it, but a model with huge weights may not)."""
    with np.errstate(over="ignore"):  # checked below, with a message naming the line
        out = np.asarray(array, dtype=dtype)
    if out.dtype != np.float32 and not np.isfinite(out).all() and np.isfinite(array).all():
        where = f" (line index {index})" if index is not None else ""
        largest = float(np.abs(array).max())
        raise ElmoTFError(f"a value of magnitude {largest:.6g}{where} does not fit {dtype}: use float32", key="dtype")
    return out


def write_embedding_file(path, embedded, dtype="float32", sentence_index=True, durable=False, attrs=None):
    """Writes `embedded`, `(Sentence, array)` pairs (`embed_sentences`; an array may be an `ArrayPieces`, written a
    piece at a time), as a valid embed output for those sentences: a dataset per sentence named by its index, and
    `sentence_to_index` for them (keys in line order, so the last of equal lines wins, as in a whole file). Atomic
    (`EmbeddingWriter`); `durable`: fsync'd before and after the rename; `attrs`: the file's root attributes
    (`output_attrs`: how long lines were handled, the precision). Returns the number of datasets written."""
    lines = []
    writer = EmbeddingWriter(path, index=sentence_index, dtype=check_dtype(dtype), durable=durable, attrs=attrs)
    with writer:
        for sentence, array in embedded:
            writer.write(sentence.index, array)
            if sentence_index:
                lines.append((sentence.index, sentence.line))
        lines.sort(key=lambda pair: pair[0])
        for index, line in lines:
            writer.add_key(index, line)
        fault_point("shard-write")
    return writer.written


def merged_sentence_index(paths):
    """The `sentence_to_index` of one file holding the lines of the embed outputs `paths`, from their own maps
    (`elmo_tf.io.embeddings_shards.merged_index_text`): the same mapping as one run over all the lines (a key maps
    to its last line); a key is placed by the first file that has it, which is its first line's place when the files
    hold consecutive line ranges in order."""
    return json.loads(merged_index_text(paths))


def _index_text(keys, paths):
    """`sentence_to_index`'s JSON text (bytes) for `merge_shards`: from the input's `LineKeys`, a dict, or the
    shards' own maps."""
    if isinstance(keys, LineKeys):
        return keys.json_text()
    return merged_index_text(paths) if keys is None else json.dumps(keys).encode()


def merge_shards(paths, output_path, keys=None, dtype="float32", sentence_index=True):
    """Writes the datasets of the embed outputs `paths` (shards of one input, each line in one of them) into one
    file `output_path` (`elmo_tf.io.embeddings_shards.write_shards`: atomic and durable, one shard open at a time),
    with `keys` as its `sentence_to_index`: the input's `LineKeys`, as `embed_file` collects them, or a dict
    `{key: "index"}` in line order, or None: `merged_index_text(paths)`. The output's root attributes are the first
    shard's (`output_attrs`). Returns the datasets written."""
    dtype = check_dtype(dtype)
    text = _index_text(keys, paths) if sentence_index else None
    written = write_shards(paths, output_path, text, dtype, after_index=release_free_memory)
    fault_point("merged")
    return written
