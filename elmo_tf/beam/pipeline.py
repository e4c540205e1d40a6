"""The Beam pipeline of `elmo-tf beam-embed`: text lines -> shards `PREFIX-SSSSS-of-NNNNN.hdf5` of embed output.

    read the input once (any Beam filesystem), numbering lines as `embed` does  -> (line index, bytes)
    count the lines (a side input)                                             -> shard = index * N // count
    group by shard (the text is shuffled, never the embeddings: ~12 KB per token for all layers)
    per shard, in a DoFn holding the model (loaded once per worker process, `apache_beam.utils.shared`):
        embed's own packing and model code (`elmo_tf.embed.iter_batches` + `Embedder.embed_rows`) over the
        shard's lines in order, written with embed's `EmbeddingWriter` (temporary name + rename)

Why a DoFn and not RunInference: a shard must be written by one worker from all its lines, and embed's packing
sorts a window of thousands of sentences by length; RunInference batches elements as they come
(`BatchElements`) and returns one result per element, which would then be shuffled a second time to reach the
shard's writer: the float arrays (thousands of times the text's size) would cross the shuffle. The DoFn
keeps RunInference's idea of one model per process (`shared.Shared`, as RunInference's ModelHandler does).

Line numbering, blank lines, keys: `elmo_tf.io.text.raw_lines_of` and `elmo_tf.preprocessing.tokenizer.
split_tokens`, the readers of `embed` (`elmo_tf.io.sentences.iter_sentences`), so each shard is the embed output
of its lines.
"""

import dataclasses
import os
import shutil
import tempfile
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.utils import shared

from elmo_tf.io.embeddings_shards import shard_path
from elmo_tf.io.sentences import EmbeddingWriter, Sentence
from elmo_tf.io.text import raw_lines_of
from elmo_tf.preprocessing.tokenizer import split_tokens


@dataclasses.dataclass(frozen=True)
class ShardedEmbedConfig:
    """What the pipeline embeds and writes (the flags of `elmo-tf beam-embed` that are not Beam's).

    Paths may be local or of any Beam filesystem (gs://, s3://, hdfs://...): model files are copied to a local
    temporary directory once per worker.
    """

    options: str
    weights: str
    input: str
    output: str  # shard prefix: PREFIX-SSSSS-of-NNNNN.hdf5
    num_shards: int = 2
    layers: str = "all"
    batch_size: int = 64
    max_batch_tokens: int | None = None
    max_sentence_tokens: int | None = None
    sort: bool = True
    token_embeddings: str | None = None
    vocab: str | None = None
    sentence_index: bool = True
    threads: int = 0

    def shard_paths(self):
        return [shard_path(self.output, k, self.num_shards) for k in range(self.num_shards)]


def is_local(path):
    """True for a path of the local file system (no scheme, or file://)."""
    return FileSystems.get_scheme(os.fspath(path)) in (None, "file")


def to_sentence(index, line, max_sentence_tokens=None):
    """The `Sentence` `iter_sentences` yields for line `line` (bytes) at 0-based `index` (its private `_sentences`,
    one line at a time)."""
    tokens = split_tokens(line)
    truncated = max_sentence_tokens is not None and len(tokens) > max_sentence_tokens
    if truncated:
        tokens = tokens[:max_sentence_tokens]
    return Sentence(index, line, tokens, truncated)


class ReadIndexedLines(beam.DoFn):
    """A path -> `(0-based line index, line bytes)` for each of its lines, as `embed` numbers them (`raw_lines`:
    "\\n" or "\\r\\n" ends, a UTF-8 byte order mark skipped, NUL bytes and UTF-16 refused)."""

    def process(self, path):
        with FileSystems.open(path, compression_type="uncompressed") as f:
            for number, _offset, line in raw_lines_of(f, path):
                yield number - 1, bytes(line)


def shard_of(index, total, num_shards):
    """Shard k holds the lines i with i * num_shards // total == k: contiguous ranges, in order."""
    return index * num_shards // max(total, 1)


class _Loaded:
    """What a worker process loads once (weak-referenceable, for `shared.Shared`)."""

    def __init__(self, model, token_embeddings):
        self.model = model
        self.token_embeddings = token_embeddings


def local_copy(path, directory):
    """`path` itself when local; otherwise a copy in `directory` (read through Beam's FileSystems)."""
    if path is None or is_local(path):
        return path
    target = os.path.join(directory, os.path.basename(path.rstrip("/")) or "file")
    with FileSystems.open(path, compression_type="uncompressed") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return target


def load_model(config):
    """The model and token cache of `config`, as `elmo-tf embed` loads them."""
    import tensorflow as tf

    from elmo_tf.embed import limit_malloc_arenas
    from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary
    from elmo_tf.models import load_elmo

    limit_malloc_arenas()
    if config.threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(config.threads)
            tf.config.threading.set_inter_op_parallelism_threads(config.threads)
        except RuntimeError:  # TensorFlow already running in this process: its pools stay as they are
            pass
    with tempfile.TemporaryDirectory(prefix="elmo_tf_beam_") as tmp:
        model = load_elmo(local_copy(config.options, tmp), local_copy(config.weights, tmp))
        token_embeddings = None
        if config.vocab is not None:
            vocabulary = read_vocabulary(local_copy(config.vocab, tmp))
            array = load_token_embeddings(
                local_copy(config.token_embeddings, tmp), vocabulary, projection_dim=model.config.projection_dim
            )
            token_embeddings = (vocabulary, array)
    return _Loaded(model, token_embeddings)


def embed_sentences(embedder, sentences, writer, batch_size=64, max_batch_tokens=None, sort=True, sentence_index=True):
    """The loop of `elmo_tf.embed.embed_file` over `sentences` (an iterable of `Sentence`) into an open
    `EmbeddingWriter`, with an `Embedder` kept from call to call. Returns counts as `embed_file` does.

    (A copy of `embed_file`'s body until `elmo_tf.embed` exposes it; it must stay line for line the same.)
    """
    import numpy as np

    from elmo_tf.embed import iter_batches

    if max_batch_tokens is None:
        max_batch_tokens = batch_size * 128
    counts = {"sentences": 0, "tokens": 0, "empty": 0, "truncated": 0}
    tokens_of = {}

    def items():
        for sentence in sentences:
            counts["sentences"] += 1
            counts["tokens"] += len(sentence.tokens)
            counts["truncated"] += sentence.truncated
            if sentence_index:
                writer.add_key(sentence.index, sentence.line)
            if not sentence.tokens:
                counts["empty"] += 1
                writer.write(sentence.index, np.zeros(embedder.empty_shape, np.float32))
                continue
            tokens_of[sentence.index] = sentence.tokens
            yield sentence.index, len(sentence.tokens)

    for batch in iter_batches(items(), batch_size, max_batch_tokens, sort, row_length=embedder.row_length):
        arrays = embedder.embed_rows([[tokens_of[i] for i in row] for row in batch])
        for i, array in zip((i for row in batch for i in row), arrays):
            writer.write(i, array)
            del tokens_of[i]
    return counts


def upload(local, path):
    """Copies the local file `local` to `path` of a Beam filesystem under a temporary name, then renames it."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(local, "rb") as src, FileSystems.create(tmp, compression_type="uncompressed") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    FileSystems.rename([tmp], [path])


class EmbedShard(beam.DoFn):
    """`(shard, [(line index, bytes) or None, ...])` -> the path of the shard file written (a valid embed output of
    those lines). The model is loaded once per worker process (`setup`, shared by its threads)."""

    def __init__(self, config):
        self.config = config
        self._shared = shared.Shared()
        self._embedder = None

    def setup(self):
        from elmo_tf.embed import Embedder

        loaded = self._shared.acquire(lambda: load_model(self.config), tag=repr(self.config))
        self._embedder = Embedder(loaded.model, self.config.layers, token_embeddings=loaded.token_embeddings)

    def process(self, element):
        shard, items = element
        config = self.config
        lines = sorted(item for item in items if item is not None)
        sentences = (to_sentence(i, line, config.max_sentence_tokens) for i, line in lines)
        path = shard_path(config.output, shard, config.num_shards)
        kwargs = dict(
            batch_size=config.batch_size,
            max_batch_tokens=config.max_batch_tokens,
            sort=config.sort,
            sentence_index=config.sentence_index,
        )
        if is_local(path):
            with EmbeddingWriter(path, index=config.sentence_index) as writer:
                counts = embed_sentences(self._embedder, sentences, writer, **kwargs)
        else:
            with tempfile.TemporaryDirectory(prefix="elmo_tf_shard_") as tmp:
                local = os.path.join(tmp, os.path.basename(path))
                with EmbeddingWriter(local, index=config.sentence_index) as writer:
                    counts = embed_sentences(self._embedder, sentences, writer, **kwargs)
                upload(local, path)
        beam.metrics.Metrics.counter("elmo_tf", "sentences").inc(counts["sentences"])
        beam.metrics.Metrics.counter("elmo_tf", "tokens").inc(counts["tokens"])
        yield path


class EmbedToShards(beam.PTransform):
    """The whole pipeline from a pipeline root: returns the PCollection of the shard paths written."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def expand(self, root):
        n = self.config.num_shards
        lines = root | "Input" >> beam.Create([self.config.input]) | "ReadLines" >> beam.ParDo(ReadIndexedLines())
        total = beam.pvalue.AsSingleton(lines | "CountLines" >> beam.combiners.Count.Globally())
        keyed = lines | "ToShard" >> beam.Map(lambda item, total: (shard_of(item[0], total, n), item), total=total)
        every = root | "EveryShard" >> beam.Create([(k, None) for k in range(n)])  # an empty shard is written too
        grouped = (keyed, every) | "All" >> beam.Flatten() | "ByShard" >> beam.GroupByKey()
        return grouped | "Embed" >> beam.ParDo(EmbedShard(self.config))


def run(config, pipeline_options):
    """Runs the pipeline (`beam.Pipeline(options=pipeline_options)`) to the end; returns the shard paths."""
    with beam.Pipeline(options=pipeline_options) as p:
        _ = p | "EmbedToShards" >> EmbedToShards(config)
    return config.shard_paths()


__all__ = [
    "EmbedShard",
    "EmbedToShards",
    "ReadIndexedLines",
    "ShardedEmbedConfig",
    "embed_sentences",
    "is_local",
    "run",
    "shard_of",
    "to_sentence",
]
