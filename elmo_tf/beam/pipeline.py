"""The Beam pipeline of `elmo-tf beam-embed`: text lines -> shards `PREFIX-SSSSS-of-NNNNN.hdf5` of embed output.

    read the input once (any Beam filesystem), numbering lines as `embed` does  -> (line index, bytes)
        and digesting them as they are read (a side input: the input's identity)
    count the lines (a side input)                                             -> shard = index * N // count
    group by shard (the text is shuffled, never the embeddings: ~12 KB per token for all layers)
    per shard, in a DoFn holding the model (loaded once per worker process, `apache_beam.utils.shared`):
        embed's own packing, model and writing code (`elmo_tf.embed.embed_sentences` + `write_embedding_file`)
        over the shard's lines in order (temporary name + rename), a longer line than `max_sentence_tokens` split
        into pieces as embed splits it; the shard's root attributes say the bound and the precision (`output_attrs`),
        the run's fingerprint and the shard's place in the set (`shard_fingerprint`, `shard_attrs`), which
        `merge-shards` checks

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
import hashlib
import os
import shutil
import tempfile
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.utils import shared

from elmo_tf.embed.output import output_attrs
from elmo_tf.io.embeddings_shards import shard_attrs, shard_path
from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS, content_attrs, to_sentence
from elmo_tf.io.text import raw_lines_of

DIGEST = "digest"  # ReadIndexedLines' tagged output: the input's identity (`lines_digest`)


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
    max_sentence_tokens: int | None = DEFAULT_MAX_SENTENCE_TOKENS  # longer lines are split, as embed splits them
    sort: bool = True
    token_embeddings: str | None = None
    vocab: str | None = None
    sentence_index: bool = True
    threads: int = 0
    dtype: str = "float32"  # of the datasets: "float32" or "float16" (`elmo_tf.embed.check_dtype`)
    # what the workers' model computes in: "float32" or "bfloat16" ("auto" is resolved by the launcher: one precision
    # for every shard of a run; `elmo_tf.beam.options.ElmoTFOptions`)
    precision: str = "float32"

    def shard_paths(self):
        return [shard_path(self.output, k, self.num_shards) for k in range(self.num_shards)]


def is_local(path):
    """True for a path of the local file system (no scheme, or file://)."""
    return FileSystems.get_scheme(os.fspath(path)) in (None, "file")


class LinesDigest:
    """The identity of an input as `embed` reads it: the SHA-256 of its lines in order (each line's bytes, without its
    line end or a first line's byte order mark, after its length as 8 bytes), their number and their bytes. Two
    inputs with the same digest give the same embed output, whatever their line ends."""

    def __init__(self):
        self._sha256 = hashlib.sha256()
        self.lines = self.bytes = 0

    def update(self, line):
        self._sha256.update(len(line).to_bytes(8, "little"))
        self._sha256.update(line)
        self.lines += 1
        self.bytes += len(line)

    def value(self):
        """`{"lines_sha256": hex, "lines": n, "bytes": n}` (the `input` entry of `shard_fingerprint`)."""
        return {"lines_sha256": self._sha256.hexdigest(), "lines": self.lines, "bytes": self.bytes}


def lines_digest(lines):
    """`LinesDigest(...).value()` of `lines` (bytes each, in order)."""
    digest = LinesDigest()
    for line in lines:
        digest.update(line)
    return digest.value()


class ReadIndexedLines(beam.DoFn):
    """A path -> `(0-based line index, line bytes)` for each of its lines, as `embed` numbers them (`raw_lines`:
    "\\n" or "\\r\\n" ends, a UTF-8 byte order mark skipped, NUL bytes and UTF-16 refused). With `digest`, then
    the lines' `LinesDigest` value on the tagged output `DIGEST`, from the same read."""

    def __init__(self, digest=False):
        self.digest = digest

    def process(self, path):
        digest = LinesDigest() if self.digest else None
        with FileSystems.open(path, compression_type="uncompressed") as f:
            for number, _offset, line in raw_lines_of(f, path):
                line = bytes(line)
                if digest is not None:
                    digest.update(line)
                yield number - 1, line
        if digest is not None:
            yield beam.pvalue.TaggedOutput(DIGEST, digest.value())


def shard_of(index, total, num_shards):
    """Shard k holds the lines i with i * num_shards // total == k: contiguous ranges, in order."""
    return index * num_shards // max(total, 1)


class _Loaded:
    """What a worker process loads once (weak-referenceable, for `shared.Shared`)."""

    def __init__(self, model, token_embeddings):
        self.model = model
        self.token_embeddings = token_embeddings
        self.fingerprints = {}  # layers -> shard_fingerprint without its input (hashing the weights once)


def local_copy(path, directory):
    """`path` itself when local; otherwise a copy in `directory` (read through Beam's FileSystems)."""
    if path is None or is_local(path):
        return path
    target = os.path.join(directory, os.path.basename(path.rstrip("/")) or "file")
    with FileSystems.open(path, compression_type="uncompressed") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return target


def load_model(config):
    """The model (computing in `config.precision`) and token cache of `config`, as `elmo-tf embed` loads them."""

    from elmo_tf.embed.embedder import use_threads
    from elmo_tf.embed.malloc import limit_malloc_arenas
    from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary
    from elmo_tf.models import load_elmo

    limit_malloc_arenas()
    use_threads(config.threads)
    with tempfile.TemporaryDirectory(prefix="elmo_tf_beam_") as tmp:
        model = load_elmo(local_copy(config.options, tmp), local_copy(config.weights, tmp), precision=config.precision)
        token_embeddings = None
        if config.vocab is not None:
            vocabulary = read_vocabulary(local_copy(config.vocab, tmp))
            array = load_token_embeddings(
                local_copy(config.token_embeddings, tmp), vocabulary, projection_dim=model.config.projection_dim
            )
            token_embeddings = (vocabulary, array)
    return _Loaded(model, token_embeddings)


def run_settings(config):
    """The settings of `config` that its shards' content depends on (beside the model, layers and input)."""
    return {
        "batch_size": config.batch_size,
        "max_batch_tokens": config.max_batch_tokens,
        "sort": bool(config.sort),
        "max_sentence_tokens": config.max_sentence_tokens,
        "long_sentences": content_attrs(config.max_sentence_tokens, "split")["long_sentences"],
        "sentence_index": bool(config.sentence_index),
        "dtype": config.dtype,
    }


def shard_fingerprint(embedder, config, input_digest):
    """What a shard's content depends on, the same for every shard of one run (`elmo_tf.embed.run_fingerprint`, as
    embed's journal records it): `model` (`model_fingerprint`: options and weight values), `token_embeddings`,
    `layers`, `precision` (what the model computes in, `Embedder.precision`: "float32" or "bfloat16") and the biLM's
    `implementation`, the settings of `config` (`run_settings`: `dtype`, `max_sentence_tokens`, `batch_size`...),
    TensorFlow's version and thread counts, and `input`: `input_digest` (`lines_digest` of the input's lines)."""
    from elmo_tf.embed import run_fingerprint

    fingerprint = run_fingerprint(embedder, {"sha256": None, "size": None}, **run_settings(config))
    fingerprint["implementation"] = str(getattr(embedder.model.bilm, "implementation", None))
    fingerprint["input"] = dict(input_digest)
    return fingerprint


def write_shard(embedder, sentences, path, config, attrs=None):
    """Embeds `sentences` (`Sentence`s of the shard's lines, in order, uncut) with `embed`'s own packing and model code
    (`elmo_tf.embed.embed_sentences`: a line of more than `config.max_sentence_tokens` tokens split into pieces) and
    writes them to `path` as `embed` writes its output (`elmo_tf.embed.write_embedding_file`: temporary name +
    rename), with the root attributes `output_attrs` (the bound, the precision) and `attrs` (`shard_attrs`: the run's
    fingerprint and the shard's place). Returns counts of sentences and tokens."""
    from elmo_tf.embed import embed_sentences, write_embedding_file

    counts = {"sentences": 0, "tokens": 0}

    def counted():
        for sentence in sentences:
            counts["sentences"] += 1
            counts["tokens"] += len(sentence.tokens)
            yield sentence

    embedded = embed_sentences(
        embedder,
        counted(),
        batch_size=config.batch_size,
        max_batch_tokens=config.max_batch_tokens,
        sort=config.sort,
        dtype=config.dtype,
        max_sentence_tokens=config.max_sentence_tokens,
    )
    attrs = {**output_attrs(config.max_sentence_tokens, embedder.precision), **(attrs or {})}
    write_embedding_file(path, embedded, dtype=config.dtype, sentence_index=config.sentence_index, attrs=attrs)
    return counts


def upload(local, path):
    """Copies the local file `local` to `path` of a Beam filesystem under a temporary name, then renames it."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(local, "rb") as src, FileSystems.create(tmp, compression_type="uncompressed") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    FileSystems.rename([tmp], [path])


class EmbedShard(beam.DoFn):
    """`(shard, [(line index, bytes) or None, ...])` and the input's digest (a side input: `lines_digest`) -> the path
    of the shard file written (a valid embed output of those lines, carrying the run's fingerprint and its place:
    `shard_fingerprint`, `shard_attrs`). The model is loaded once per worker process (`setup`, shared by its
    threads), its fingerprint computed once."""

    def __init__(self, config):
        self.config = config
        self._shared = shared.Shared()
        self._embedder = None
        self._fingerprint = None

    def setup(self):
        from elmo_tf.embed import Embedder

        config = self.config
        loaded = self._shared.acquire(lambda: load_model(config), tag=repr(config))
        self._embedder = Embedder(loaded.model, config.layers, token_embeddings=loaded.token_embeddings)
        if config.layers not in loaded.fingerprints:
            loaded.fingerprints[config.layers] = shard_fingerprint(self._embedder, config, {})
        self._fingerprint = loaded.fingerprints[config.layers]

    def process(self, element, input_digest):
        shard, items = element
        config = self.config
        lines = sorted(item for item in items if item is not None)
        sentences = (to_sentence(i, line) for i, line in lines)  # uncut: a long line is split (embed_sentences)
        path = shard_path(config.output, shard, config.num_shards)
        attrs = shard_attrs({**self._fingerprint, "input": dict(input_digest)}, shard, config.num_shards)
        if is_local(path):
            counts = write_shard(self._embedder, sentences, path, config, attrs)
        else:
            with tempfile.TemporaryDirectory(prefix="elmo_tf_shard_") as tmp:
                local = os.path.join(tmp, os.path.basename(path))
                counts = write_shard(self._embedder, sentences, local, config, attrs)
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
        read = (
            root
            | "Input" >> beam.Create([self.config.input])
            | "ReadLines" >> beam.ParDo(ReadIndexedLines(digest=True)).with_outputs(DIGEST, main="lines")
        )
        lines, digest = read.lines, beam.pvalue.AsSingleton(read[DIGEST])
        total = beam.pvalue.AsSingleton(lines | "CountLines" >> beam.combiners.Count.Globally())
        keyed = lines | "ToShard" >> beam.Map(lambda item, total: (shard_of(item[0], total, n), item), total=total)
        every = root | "EveryShard" >> beam.Create([(k, None) for k in range(n)])  # an empty shard is written too
        grouped = (keyed, every) | "All" >> beam.Flatten() | "ByShard" >> beam.GroupByKey()
        return grouped | "Embed" >> beam.ParDo(EmbedShard(self.config), input_digest=digest)


def run(config, pipeline_options):
    """Runs the pipeline (`beam.Pipeline(options=pipeline_options)`) to the end; returns the shard paths."""
    with beam.Pipeline(options=pipeline_options) as p:
        _ = p | "EmbedToShards" >> EmbedToShards(config)
    return config.shard_paths()


__all__ = [
    "DIGEST",
    "EmbedShard",
    "EmbedToShards",
    "LinesDigest",
    "ReadIndexedLines",
    "ShardedEmbedConfig",
    "is_local",
    "lines_digest",
    "run",
    "run_settings",
    "shard_fingerprint",
    "shard_of",
    "write_shard",
]
