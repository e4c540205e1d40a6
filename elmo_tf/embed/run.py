"""Embedding a stream of sentences (`embed_sentences`) and a whole file, journaled and resumable (`embed_file`).

How a file is run (`embed_file`), resumable:
  - One plan: the input is read once and planned into batches (`elmo_tf.embed.packing.iter_plan`), the same batches
    for the same input and settings; consecutive batches form shards of about `shard_tokens` tokens.
  - A journal: each shard is written, once done, as an embed output of its own lines (`write_embedding_file`) into
    `.<output name>.partial/` beside the output, fsync'd before it counts (`elmo_tf.io.journal.RunJournal`); at the
    end the shards are copied into the output (`merge_shards`) and the journal removed.
  - Resume: the same call with `resume=True` replays the plan, skips the shards on the disk and computes the others;
    the token memo restarts with every shard, so each shard is computed exactly as in an uninterrupted run and the
    file is the same, value for value. The journal's fingerprint (input content, model weights, token cache, every
    setting) must match, or the resume is refused.
  - `embed_sentences` + `write_embedding_file` embed any set of lines (a worker's share of a larger input, keeping
    their global line indices) into a valid embed output: the pieces a distributed job is made of.
"""

import dataclasses
import hashlib
import itertools
import logging

import h5py
import numpy as np

from elmo_tf.embed.embedder import CNN_WIDTH_PER_TOKEN, Embedder, runtime_fingerprint
from elmo_tf.embed.malloc import release_free_memory
from elmo_tf.embed.output import cast_embedding, check_dtype, merge_shards, output_attrs, write_embedding_file
from elmo_tf.embed.packing import ROW_LENGTH, default_batch_tokens, is_long, iter_plan, piece_batches
from elmo_tf.errors import check_int
from elmo_tf.io.hdf5_safety import HDF5ReferenceError, check_self_contained
from elmo_tf.io.journal import (
    JournalMismatch,
    RunJournal,
    check_unchanged,
    fault_point,
    file_digest,
    file_state,
    input_fingerprint,
    numbered_shards,
)
from elmo_tf.io.sentences import (
    DEFAULT_MAX_SENTENCE_TOKENS,
    INDEX_DATASET,
    ArrayPieces,
    LineKeys,
    iter_sentences,
)
from elmo_tf.io.text import TextFileError
from elmo_tf.models.elmo import model_fingerprint

logger = logging.getLogger(__name__)

SHARD_TOKENS = 50_000  # tokens per shard of embed_file's journal: about a minute of the original model on 2 cores
# An input of this size or more gets a warning at the start: sentence_to_index (AllenNLP's format: one JSON string of
# every line's key) is about the input's size, held at the end and three times over while HDF5 writes it.
INDEX_WARNING_BYTES = 256 << 20
# fingerprint entries added since journals were first written, as a journal of an earlier version was made
JOURNAL_DEFAULTS = {"precision": "float32"}


class _Plan:
    """How `_embed_items` computes a plan's batches: the bound on a sentence (None: none) and the budget of a call
    of its pieces."""

    def __init__(self, max_sentence_tokens=None, batch_size=64, max_batch_tokens=None):
        self.max_sentence_tokens = max_sentence_tokens
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens


def _pieces(embedder, sentence, dtype, plan, progress):
    """The arrays (as `dtype`) of the pieces of the long `sentence`, computed as they are read; `progress(1)` after
    the last."""
    tokens = sentence.tokens
    for call in piece_batches(len(tokens), plan.max_sentence_tokens, plan.batch_size, plan.max_batch_tokens):
        arrays = embedder.embed_rows([[tokens[start:stop]] for start, stop in call])
        for array in arrays:
            yield cast_embedding(array, dtype, sentence.index)
        fault_point("batch")
    if progress:
        progress(1)


def _embed_items(embedder, items, dtype, progress=None, plan=None):
    """(Sentence, array as `dtype`) for every sentence of the `(empties, batch)` items, in their order. A sentence
    longer than `plan.max_sentence_tokens` (a batch of its own: `iter_plan`) gets an `ArrayPieces`, whose pieces are
    computed as it is read (before the next pair)."""
    plan = plan or _Plan()
    for empties, batch in items:
        for sentence in empties:
            yield sentence, np.zeros(embedder.empty_shape, dtype)
        done = len(empties)
        if batch and is_long(batch[0][0], plan.max_sentence_tokens):
            if progress and done:
                progress(done)
            sentence = batch[0][0]
            shape = embedder.shape_of(len(sentence.tokens))
            yield sentence, ArrayPieces(shape, dtype, _pieces(embedder, sentence, dtype, plan, progress))
            continue
        if batch:
            flat = [s for row in batch for s in row]
            arrays = embedder.embed_rows([[s.tokens for s in row] for row in batch])
            for sentence, array in zip(flat, arrays):
                yield sentence, cast_embedding(array, dtype, sentence.index)
            done += len(flat)
            fault_point("batch")
        if progress and done:
            progress(done)


def embed_sentences(
    embedder,
    sentences,
    batch_size=64,
    max_batch_tokens=None,
    sort=True,
    row_length=ROW_LENGTH,
    dtype="float32",
    max_sentence_tokens=DEFAULT_MAX_SENTENCE_TOKENS,
):
    """Yields `(sentence, array)` for each `Sentence` of `sentences` (any iterable: a file's `iter_sentences`, a set of
    lines of a larger input keeping their global `index`), packed and batched as `embed_file` does (`iter_plan`), as
    soon as each batch is done; empty sentences get `(L+1, 0, 2P)` zeros. `array` has `dtype` ("float32" or
    "float16"). A sentence longer than `max_sentence_tokens` (None: no bound) is split into consecutive pieces of
    that many tokens, each embedded as a sentence of its own, and gets an `elmo_tf.io.sentences.ArrayPieces` (every
    token's vector, computed piece by piece as it is read, before the next pair: `write_embedding_file` writes it a
    piece at a time, `np.asarray` makes it whole). What a worker of a distributed job calls on its lines before
    `write_embedding_file` (give it `output_attrs(max_sentence_tokens, embedder.precision)` as `attrs`)."""
    dtype = check_dtype(dtype)
    if max_batch_tokens is None:
        max_batch_tokens = default_batch_tokens(batch_size, embedder.model.config)
    plan = _Plan(max_sentence_tokens, batch_size, max_batch_tokens)
    items = iter_plan(sentences, batch_size, max_batch_tokens, sort, row_length, max_sentence_tokens)
    yield from _embed_items(embedder, items, dtype, plan=plan)


def _numbered_shards(items, shard_tokens):
    """`(shard number, empties, batch)` for the `iter_plan` items (`numbered_shards`, counting the batches' tokens). A
    last item without sentences is dropped."""
    items = itertools.takewhile(lambda item: item[1] is not None or item[0], items)
    for number, (empties, batch) in numbered_shards(items, shard_tokens, _batch_tokens):
        yield number, empties, batch


def _batch_tokens(item):
    _empties, batch = item
    return 0 if batch is None else sum(len(s.tokens) for row in batch for s in row)


def _cache_fingerprint(cache):
    if cache is None:
        return None
    digest = hashlib.sha256()
    for token in cache.tokens:
        digest.update(len(token).to_bytes(4, "little") + token)
    digest.update(np.ascontiguousarray(cache.embedding, np.float32).tobytes())
    return digest.hexdigest()


def _short_hash(value):
    return f"sha256 {value[:12]}"


FINGERPRINT_SHOWN = {
    "input": lambda v: f"sha256 {v['sha256'][:12]}, {v['size']} bytes",
    "model": _short_hash,
    "token_embeddings": _short_hash,
}


def run_fingerprint(embedder, digest, **settings):
    """What an embed run's output depends on, for `RunJournal`: the input's content (`file_digest`), the model's
    config and weights, the precision it computes in, the token cache, every setting, TensorFlow's version and
    thread counts."""
    return {
        "input": input_fingerprint(digest),
        "model": model_fingerprint(embedder.model),
        "precision": embedder.precision,
        "token_embeddings": _cache_fingerprint(embedder.token_cache),
        "layers": embedder.layers,
        **settings,
        "row_length": embedder.row_length,
        "gate_chunk": embedder.gate_chunk,
        "cnn_chunk": embedder.cnn_chunk,
        "cnn_width_per_token": CNN_WIDTH_PER_TOKEN,
        "memo_size": embedder.memo_size,
        **runtime_fingerprint(),
    }


def run_journal(output_path, fingerprint, resume, notes, shown=None, suffix=".hdf5"):
    """The `RunJournal` of an embed (or score) run: values shown as `shown` (default `FINGERPRINT_SHOWN`), the entries a
    journal of an earlier version lacks compared as `JOURNAL_DEFAULTS`."""
    shown = FINGERPRINT_SHOWN if shown is None else shown
    return RunJournal(
        output_path, fingerprint, resume=resume, notes=notes, shown=shown, suffix=suffix, defaults=JOURNAL_DEFAULTS
    )


def _count_sentences(sentences, counts, keys, max_sentence_tokens):
    for sentence in sentences:
        counts["sentences"] += 1
        counts["tokens"] += len(sentence.tokens)
        counts["truncated"] += sentence.truncated
        counts["split"] += is_long(sentence, max_sentence_tokens)
        counts["empty"] += not sentence.tokens
        if keys is not None:
            keys.add(sentence.line)
        yield sentence


def _finished_shards(journal):
    """`{number: sentences}` of the journal's finished shards; one that cannot be read is removed (written again). A
    shard that points outside itself (`elmo_tf.io.hdf5_safety`) is refused (`HDF5ReferenceError`), never read."""
    found = {}
    for number, path in sorted(journal.done.items()):
        try:
            with h5py.File(path, "r") as f:
                check_self_contained(f, path)
                found[number] = sum(1 for name in f if name != INDEX_DATASET)
        except HDF5ReferenceError:
            raise
        except (OSError, ValueError) as e:
            logger.warning("shard %s cannot be read (%s): it is computed again", path, e)
            journal.discard(number)
    return found


def _check_shard(path, sentences, shape_of, dtype):
    """Raises `JournalMismatch` unless the finished shard at `path` holds exactly the datasets the plan gives it: one
    per `Sentence` of `sentences`, of shape `shape_of(tokens)` and `dtype` (so its lines are where a merge expects
    them, each once)."""
    expected = {str(s.index): s for s in sentences}
    with h5py.File(path, "r") as f:
        names = [name for name in f if name != INDEX_DATASET]
        for name in names:
            sentence = expected.get(name)
            if sentence is None:
                held = "line index" if name.isdigit() else "dataset"
                raise JournalMismatch(path, f"holds {held} {name}, which this run's plan puts in another shard")
            dataset = f[name]
            shape = shape_of(len(sentence.tokens))
            if not isinstance(dataset, h5py.Dataset) or dataset.shape != shape or dataset.dtype != dtype:
                got = f"{dataset.shape} {dataset.dtype}" if isinstance(dataset, h5py.Dataset) else "a group"
                raise JournalMismatch(path, f"holds line index {name} as {got}, where this run writes {shape} {dtype}")
        if len(names) != len(expected):
            missing = min(set(expected) - set(names), key=int)
            raise JournalMismatch(path, f"lacks line index {missing}, which this run's plan puts in it")


def _check_no_more_shards(journal, shards):
    """Raises `JournalMismatch` for a finished shard numbered past the plan's last (`shards` in all)."""
    extra = sorted(number for number in journal.done if number >= shards)
    if extra:
        raise JournalMismatch(journal.shard_path(extra[0]), f"is past this run's last shard ({shards} in all)")


def _check_output(dtype, shard_tokens):
    """`embed_file`'s checked `dtype` and `shard_tokens`."""
    dtype = check_dtype(dtype)
    shard_tokens = check_int("shard_tokens", shard_tokens, 1)
    return dtype, shard_tokens


def _batch_bounds(model, batch_size, max_batch_tokens, max_sentence_tokens):
    """`embed_file`'s `_Plan`: `max_batch_tokens` (None: `default_batch_tokens`) and checked `max_sentence_tokens`."""
    if max_batch_tokens is None:
        max_batch_tokens = default_batch_tokens(batch_size, model.config)
    max_sentence_tokens = check_int("max_sentence_tokens", max_sentence_tokens, 1, allow_none=True)
    return _Plan(max_sentence_tokens, batch_size, max_batch_tokens)


def _numbered_plan(sentences, keys, bounds, sort, row_length, shard_tokens):
    """`embed_file`'s counts of the input (filled as the plan is read) and its plan (`iter_plan` of `sentences`,
    counted into the counts and `keys`) numbered in shards."""
    counts = {"sentences": 0, "tokens": 0, "empty": 0, "truncated": 0, "split": 0}
    counted = _count_sentences(sentences, counts, keys, bounds.max_sentence_tokens)
    plan = iter_plan(counted, bounds.batch_size, bounds.max_batch_tokens, sort, row_length, bounds.max_sentence_tokens)
    return counts, _numbered_shards(plan, shard_tokens)


def _finish_run(journal, shards, input_path, before, output_path, keys, dtype, sentence_index):
    """Checks the journal holds no more shards and the input is unchanged, then merges the shards into the output."""
    _check_no_more_shards(journal, shards)
    check_unchanged(input_path, before)
    merge_shards([journal.shard_path(k) for k in range(shards)], output_path, keys, dtype, sentence_index)


def _start_shards(journal, on_start, lines):
    """The journal's finished shards (`{number: sentences}`), after `on_start(lines, sentences already done)`."""
    finished = _finished_shards(journal)
    if on_start:
        on_start(lines, sum(finished.values()))
    return finished


def _run_counts(counts, embedder, shards, finished):
    """`embed_file`'s returned counts: the input's `counts`, the embedder's stats and the shards'."""
    counts.update((key, value) for key, value in embedder.stats.items() if key != "tokens")
    counts.update(
        computed_tokens=embedder.stats["tokens"],
        shards=shards,
        resumed_shards=len(finished),
        resumed_sentences=sum(finished.values()),
    )
    return counts


def _open_input(input_path):
    """`embed_file`'s input: its sentences (read lazily, never cut: a long line is split by `iter_plan` and
    `_embed_items`), its state (`file_state`, checked unchanged at the end) and its digest."""
    sentences = iter_sentences(input_path)
    try:
        before = file_state(input_path)
        digest = file_digest(input_path)
    except OSError as e:
        raise TextFileError(f"{input_path}: {e.strerror or e}", path=str(input_path)) from None
    return sentences, before, digest


def _file_fingerprint(embedder, digest, dtype, plan, sort, sentence_index, shard_tokens):
    """`run_fingerprint` of an `embed_file` run: the input's digest, the model and every setting."""
    return run_fingerprint(
        embedder,
        digest,
        dtype=dtype,
        batch_size=plan.batch_size,
        max_batch_tokens=plan.max_batch_tokens,
        sort=bool(sort),
        max_sentence_tokens=plan.max_sentence_tokens,
        long_sentences="split" if plan.max_sentence_tokens is not None else "whole",
        sentence_index=bool(sentence_index),
        shard_tokens=shard_tokens,
    )


def _warn_index_size(input_path, digest, sentence_index):
    """Logs a warning when `sentence_to_index` of an input this large would take much memory at the end."""
    if sentence_index and digest["size"] >= INDEX_WARNING_BYTES:
        logger.warning(
            "%s is %.2f GB: its sentence_to_index (every line's key in one JSON string) takes about as much memory at "
            "the end, three times as much while it is written; without it (--no-sentence-index, sentence_index=False) "
            "memory stays flat",
            input_path,
            digest["size"] / 1e9,
        )


@dataclasses.dataclass(frozen=True)
class _ShardRun:
    """What `_write_shards` writes each shard with: the journal, the embedder and the output's settings."""

    journal: object
    embedder: object
    dtype: str
    progress: object
    plan: _Plan
    sentence_index: bool


def _write_shards(run, numbered, finished):
    """Computes and writes into the journal each shard of `numbered` (`_numbered_shards`) not in `finished`; reads
    past a finished one, checking it holds its lines. Returns the number of shards of the plan."""
    attrs = output_attrs(run.plan.max_sentence_tokens, run.embedder.precision)
    shards = 0
    for number, group in itertools.groupby(numbered, key=lambda item: item[0]):
        shards = number + 1
        items = ((empties, batch) for _, empties, batch in group)
        if number in finished:  # read past it (the plan goes on as in the first run), checking it holds its lines
            planned = [s for empties, batch in items for s in [*empties, *(s for row in batch or () for s in row)]]
            _check_shard(run.journal.shard_path(number), planned, run.embedder.shape_of, np.dtype(run.dtype))
            continue
        run.embedder.reset_memo()
        embedded = _embed_items(run.embedder, items, run.dtype, run.progress, run.plan)
        path = run.journal.shard_path(number)
        write_embedding_file(path, embedded, run.dtype, run.sentence_index, durable=True, attrs=attrs)
        release_free_memory()
        fault_point("shard")
    return shards


def embed_file(
    model,
    input_path,
    output_path,
    batch_size=64,
    layers="all",
    max_batch_tokens=None,
    sort=True,
    max_sentence_tokens=DEFAULT_MAX_SENTENCE_TOKENS,
    progress=None,
    token_embeddings=None,
    sentence_index=True,
    row_length=ROW_LENGTH,
    dtype="float32",
    resume=False,
    shard_tokens=SHARD_TOKENS,
    on_start=None,
    notes=None,
):
    """Writes one dataset per input line ("0", "1", ...) plus `sentence_to_index` to `output_path` (hdf5); resumable.

    The input is read once, line by line (`elmo_tf.io.sentences.iter_sentences`), and packed into batches
    (`iter_plan`); consecutive batches form shards of about `shard_tokens` tokens, each written, as soon as it is
    done, to the run's journal beside the output (`elmo_tf.io.journal.RunJournal`: `.<output name>.partial/`, every
    shard complete and fsync'd before it counts). At the end the shards are copied into the output (written under a
    temporary name and renamed) and the journal is removed. An interrupted run (SIGKILL, SIGTERM, Ctrl-C, a full
    disk) leaves an existing output as it was and keeps its finished shards: the same call with `resume=True` reads
    the input again, skips the shards already written, computes the others and writes the same file as an
    uninterrupted run, value for value (the token memo restarts with every shard, so a shard is computed the same
    whether or not the run before it was interrupted). A resume whose input content, model, token cache or setting
    differs raises `ResumeRefused` naming each; without `resume`, a partial state is removed and the run starts over.
    Memory holds one window of sentences, one batch and one dataset being copied, whatever the file's size, plus,
    unless `sentence_index` is False, 16 bytes a line for `sentence_to_index` (`elmo_tf.io.sentences.LineKeys`: the
    input is read once more at the end for the keys' text) and, at the end, that JSON text. Disk: the output twice,
    briefly.

    Args:
        batch_size: packed rows per batch (a row holds several short sentences).
        sort: pack sentences of similar length together within windows of `50 * batch_size` sentences; without
            it, batches follow the file with one batch of look-ahead.
        max_batch_tokens: cap on rows x steps of a batch (default `default_batch_tokens`: `128 * batch_size`,
            fewer for a model whose call would cost more than about 4 s).
        max_sentence_tokens: a line of more tokens is split into consecutive pieces of this many (the last one
            shorter), each embedded as a sentence of its own (between its own `<S>` and `</S>`), in model calls of
            at most `max_batch_tokens` positions (one piece at least): its dataset holds every token's vector, the
            pieces' put back in order, written piece by piece (memory and the time of one model call do not grow
            with a line). None: no bound (a line is one model call, however long). The output's root attributes
            say it, and the precision: `max_sentence_tokens`, `long_sentences`, `precision` (`output_attrs`).
        progress: optional callable `progress(n_sentences_done)` called after each batch computed in this run.
        token_embeddings: optional `(vocabulary, array)` or `TokenCache` (see `Embedder`).
        sentence_index: write `sentence_to_index` (AllenNLP's map from sentence to dataset name).
        dtype: "float32", or "float16" (half the file, each value rounded to the nearest float16).
        resume: continue the partial run of the same call into `output_path`, if there is one.
        shard_tokens: tokens per shard (at most that much work is lost to a kill; changes the run's fingerprint).
        on_start: optional callable `on_start(total_sentences, done_sentences)`, called once before the first batch
            (the input's line count, and how many lines a resumed run already has).
        notes: `{fingerprint name: text}` shown beside a differing value when a resume is refused (file names).
    Returns:
        dict of counts: sentences, tokens, empty, split (lines split in pieces), truncated (always 0: nothing is
        cut) (of the whole input); shards, resumed_shards,
        resumed_sentences; computed_tokens and the embedder's other stats (of the batches computed in this run).
    Raises:
        ResumeRefused, JournalBusy, JournalMismatch (`elmo_tf.io.journal`); `elmo_tf.io.atomic.WriteError`;
        `elmo_tf.io.text.TextFileError`.
    """
    dtype, shard_tokens = _check_output(dtype, shard_tokens)
    embedder = Embedder(model, layers, token_embeddings=token_embeddings, row_length=row_length)
    bounds = _batch_bounds(model, batch_size, max_batch_tokens, max_sentence_tokens)
    sentences, before, digest = _open_input(input_path)
    fingerprint = _file_fingerprint(embedder, digest, dtype, bounds, sort, sentence_index, shard_tokens)
    _warn_index_size(input_path, digest, sentence_index)
    notes = {"input": str(input_path), **(notes or {})}
    keys = LineKeys(input_path) if sentence_index else None
    with run_journal(output_path, fingerprint, resume, notes) as journal:
        finished = _start_shards(journal, on_start, digest["lines"])
        counts, numbered = _numbered_plan(sentences, keys, bounds, sort, row_length, shard_tokens)
        run = _ShardRun(journal, embedder, dtype, progress, bounds, sentence_index)
        shards = _write_shards(run, numbered, finished)
        _finish_run(journal, shards, input_path, before, output_path, keys, dtype, sentence_index)
    return _run_counts(counts, embedder, shards, finished)
