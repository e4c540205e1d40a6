"""Scores every line of a text file with a `LanguageModel`: one JSON line per input line (`elmo-tf score`).

Each record holds `tokens` (the line split on ASCII whitespace, decoded as UTF-8 with invalid bytes as lone surrogates,
as `embed`'s keys), `forward_log_probs` and `backward_log_probs` (n + 1 values each, `sentence_log_probs`'s order),
and with a top k, `forward_top_k` / `backward_top_k`: per position a list of `[word, log_prob]`, most likely first.
A record scored by a model computing in bfloat16 says so: `"precision": "bfloat16"` (`elmo_tf.precision`; float32
records are as they always were).
A line longer than `max_tokens` (default `elmo_tf.io.sentences.DEFAULT_MAX_SENTENCE_TOKENS`) is scored on its first
`max_tokens` tokens, and its record says so: `"truncated": true` and `"line_tokens"`, the line's own count (splitting
it, as embed does, would score each piece's first word as a sentence's first and put several boundaries in one
record; a cut line's record is a true score of the tokens it lists).
The input is read once, as a stream; batches are scored in file order and written, as they are done, in shards of
about `shard_tokens` tokens to the run's journal beside the output (`elmo_tf.io.journal.RunJournal`:
`.<output name>.partial/`, each shard complete and fsync'd before it counts); at the end the shards are concatenated
into the output (under a temporary name, renamed: `elmo_tf.io.atomic`) and the journal removed. An interrupted run
keeps its finished shards: the same call with `resume=True` skips them and writes the same bytes as an uninterrupted
run (a batch is scored the same whatever came before it; the batches are the same since the fingerprint holds every
setting that groups them). A resume whose input, model, precision, softmax, vocabulary, top k or setting differs is
refused.
"""

import hashlib
import itertools
import json
import shutil

import numpy as np
import tensorflow as tf

from elmo_tf.embed.embedder import model_precision, runtime_fingerprint
from elmo_tf.embed.packing import default_batch_tokens
from elmo_tf.embed.run import FINGERPRINT_SHOWN, run_journal
from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.io.atomic import atomic_path, write_error
from elmo_tf.io.journal import (
    JournalMismatch,
    check_unchanged,
    fault_point,
    file_digest,
    file_state,
    input_fingerprint,
    numbered_shards,
)
from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS, iter_sentences
from elmo_tf.models.elmo import model_fingerprint
from elmo_tf.models.language_model import DIRECTIONS
from elmo_tf.preprocessing.tokenizer import split_tokens

DEFAULT_BATCH_SIZE = 32
SHARD_TOKENS = 50_000  # positions (tokens + 1 per line) per shard of score_file's journal


def _text(token):
    return token.decode("utf-8", "surrogateescape")


def batches(sentences, batch_size, max_batch_tokens=None):
    """Groups `Sentence`s in file order: at most `batch_size` per batch and rows x the longest sentence at most
    `max_batch_tokens` (a longer sentence goes alone)."""
    batch, longest = [], 0
    for sentence in sentences:
        width = max(longest, len(sentence.tokens))
        if batch and (len(batch) == batch_size or (max_batch_tokens and (len(batch) + 1) * width > max_batch_tokens)):
            yield batch
            batch, width = [], len(sentence.tokens)
        batch.append(sentence)
        longest = width
    if batch:
        yield batch


class ScoreError(ElmoTFError):
    """Scores that cannot be written: the model gives NaN or inf (its weights overflow float32). Names the line."""


def _check_finite(outputs, row, end, sentence, path):
    for key, value in outputs.items():
        if value.dtype.kind == "f" and not np.isfinite(value[row, :end]).all():
            raise ScoreError(
                f"{path}:{sentence.index + 1}: the model's {key} are not finite (NaN or inf): its weights or softmax "
                "overflow float32 (JSON has no NaN; nothing was written)",
                path=str(path),
                line=sentence.index + 1,
            )


def records(outputs, sentences, top_k, path=None, precision="float32"):
    """The JSON records (dicts) of one scored batch (`path`: the input, named by `ScoreError`; `precision`: what the
    model computed in, in each record unless float32)."""
    result = []
    for row, sentence in enumerate(sentences):
        end = len(sentence.tokens) + 1
        _check_finite(outputs, row, end, sentence, path)
        record = {"tokens": [_text(t) for t in sentence.tokens]}
        if sentence.truncated:
            record.update(truncated=True, line_tokens=len(split_tokens(sentence.line)))
        for direction in DIRECTIONS:
            record[f"{direction}_log_probs"] = outputs[f"{direction}_log_probs"][row, :end].tolist()
        if top_k:
            for direction in DIRECTIONS:
                words = outputs[f"{direction}_top_k_words"][row, :end]
                log_probs = outputs[f"{direction}_top_k_log_probs"][row, :end].tolist()
                record[f"{direction}_top_k"] = [
                    [[_text(w), p] for w, p in zip(ws, ps)] for ws, ps in zip(words, log_probs)
                ]
        if precision != "float32":
            record["precision"] = precision
        result.append(record)
    return result


def scorer(lm):
    """A `tf.function` tokens `(batch, T)` tf.string -> the numpy outputs of `lm.score_tokens`."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string)], autograph=False)
    def run(tokens):
        return lm.score_tokens(tokens)

    def call(token_lists):
        width = max(len(t) for t in token_lists)
        padded = [list(t) + [b""] * (width - len(t)) for t in token_lists]
        tokens = tf.constant(padded, tf.string) if width else tf.zeros([len(padded), 0], tf.string)
        return {key: value.numpy() for key, value in run(tokens).items()}

    return call


def _hash_arrays(*arrays):
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype}:{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def _vocab_hash(lm):
    digest = hashlib.sha256()
    for word in lm.top_k_words(tf.range(lm.vocab_size)).numpy().tolist():
        digest.update(len(word).to_bytes(4, "little") + word)
    return digest.hexdigest()


def run_fingerprint(lm, digest, **settings):
    """What a score run's output depends on, for `RunJournal`: the input's content (`file_digest`), the biLM's config
    and weights, the precision it computes in, the softmax, the vocabulary, the top k, every setting, TensorFlow's
    version and thread counts."""

    return {
        "input": input_fingerprint(digest),
        "model": model_fingerprint(lm),
        "precision": model_precision(lm),
        "softmax": _hash_arrays(lm.softmax_kernel.numpy(), lm.softmax_bias.numpy()),
        "vocab": _vocab_hash(lm),
        "top_k": lm.top_k,
        **settings,
        "chunk_size": lm.chunk_size,
        **runtime_fingerprint(),
    }


def _numbered(batches, shard_tokens):
    """`(shard number, batch)`: consecutive batches of about `shard_tokens` positions (tokens + 1 per line) a shard."""
    return numbered_shards(batches, shard_tokens, lambda batch: sum(len(s.tokens) + 1 for s in batch))


def _finished_lines(journal):
    """`{number: lines}` of the journal's finished shards (each written whole: a line per record)."""
    found = {}
    for number, path in sorted(journal.done.items()):
        with open(path, "rb") as f:
            found[number] = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    return found


def _check_shard(path, sentences):
    """Raises `JournalMismatch` unless the finished shard at `path` holds a record per `Sentence` of `sentences` (the
    plan's for that shard), in order, each of that sentence's tokens."""
    count = 0
    with open(path, "rb") as f:
        for k, line in enumerate(f):
            count = k + 1
            if k >= len(sentences):
                raise JournalMismatch(path, f"holds more than the {len(sentences)} records this run's plan gives it")
            try:
                tokens = json.loads(line)["tokens"]
            except (ValueError, KeyError, TypeError):
                raise JournalMismatch(path, f"record {k + 1} is not a record of this command") from None
            sentence = sentences[k]
            if tokens != [_text(t) for t in sentence.tokens]:
                raise JournalMismatch(path, f"record {k + 1} is not of input line {sentence.index + 1}")
    if count != len(sentences):
        raise JournalMismatch(path, f"holds {count} records where this run's plan gives it {len(sentences)}")


def _write_shard(path, run, group, lm, input_path, progress):
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, "w", encoding="utf-8") as out:
            for _, batch in group:
                outputs = run([s.tokens for s in batch])
                for record in records(outputs, batch, lm.top_k, input_path, model_precision(lm)):
                    out.write(json.dumps(record, allow_nan=False) + "\n")
                if progress:
                    progress(len(batch))
                fault_point("batch")
        fault_point("shard-write")


def _concatenate(paths, output_path):
    with atomic_path(output_path, durable=True) as tmp:
        with open(tmp, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
                fault_point("merge")
    fault_point("merged")


def score_file(
    lm,
    input_path,
    output_path,
    batch_size=DEFAULT_BATCH_SIZE,
    max_batch_tokens=None,
    progress=None,
    max_tokens=DEFAULT_MAX_SENTENCE_TOKENS,
    resume=False,
    shard_tokens=SHARD_TOKENS,
    on_start=None,
    notes=None,
):
    """Writes one JSON line per line of `input_path` to `output_path` (atomically, resumably: see the module
    docstring); returns `{"sentences", "tokens"}` counted (of the whole input), `shards`, `resumed_shards` and
    `resumed_sentences`.

    Args:
        lm: a `LanguageModel` with a vocabulary attached (`load_language_model`).
        batch_size: sentences per model call; max_batch_tokens: cap on rows x the longest sentence (None:
            `elmo_tf.embed.packing.default_batch_tokens` with the softmax's cost; a longer sentence goes alone).
        progress: optional callable(sentences done), after each batch scored in this run.
        max_tokens: cut longer lines to their first `max_tokens` tokens, their records marked (see the module
            docstring; None: never, and a line is one model call however long).
        resume: continue the partial run of the same call into `output_path`, if there is one.
        shard_tokens: positions (tokens + 1 per line) per shard: at most that much work is lost to a kill.
        on_start: optional callable(total lines, lines a resumed run already has), once before the first batch.
        notes: `{fingerprint name: text}` shown beside a differing value when a resume is refused (file names).
    Raises:
        elmo_tf.io.text.TextFileError: an unreadable input line, or an input changed while read (the message names
            it); WriteError: a full disk (the temporary is removed, an existing output kept, finished shards too);
            ScoreError: NaN or inf scores (naming the line); ResumeRefused, JournalBusy, NotAJournal, JournalMismatch
            (`elmo_tf.io.journal`).
    """
    from elmo_tf.io.text import TextFileError

    batch_size = check_int("batch_size", batch_size, 1)
    check_int("max_batch_tokens", max_batch_tokens, 1, allow_none=True)
    if max_batch_tokens is None:  # both directions' full softmax on top of the biLM, at every position
        softmax = 2 * lm.vocab_size * lm.config.projection_dim
        max_batch_tokens = default_batch_tokens(batch_size, lm.config, extra_per_position=softmax)
    shard_tokens = check_int("shard_tokens", shard_tokens, 1)
    sentences = iter_sentences(input_path, max_tokens)  # checks max_tokens now
    try:
        before = file_state(input_path)
        digest = file_digest(input_path)
    except OSError as e:
        raise TextFileError(f"{input_path}: {e.strerror or e}", path=str(input_path)) from None
    settings = dict(batch_size=batch_size, max_batch_tokens=max_batch_tokens, max_sentence_tokens=max_tokens)
    settings["long_sentences"] = "truncated" if max_tokens is not None else "whole"
    fingerprint = run_fingerprint(lm, digest, **settings, shard_tokens=shard_tokens)
    notes = {"input": str(input_path), **(notes or {})}
    shown = {**FINGERPRINT_SHOWN, "softmax": FINGERPRINT_SHOWN["model"], "vocab": FINGERPRINT_SHOWN["model"]}
    run = scorer(lm)
    stats = {"sentences": 0, "tokens": 0, "shards": 0, "truncated": 0}
    try:
        with run_journal(output_path, fingerprint, resume, notes, shown, ".jsonl") as journal:
            finished = _finished_lines(journal)
            if on_start:
                on_start(digest["lines"], sum(finished.values()))
            counted = _counted(sentences, stats)
            numbered = _numbered(batches(counted, batch_size, max_batch_tokens), shard_tokens)
            for number, group in itertools.groupby(numbered, key=lambda item: item[0]):
                stats["shards"] = number + 1
                if number in finished:  # read past it (the batches go on as in the first run), checking its records
                    _check_shard(journal.shard_path(number), [s for _, batch in group for s in batch])
                    continue
                _write_shard(journal.shard_path(number), run, group, lm, input_path, progress)
                fault_point("shard")
            extra = sorted(number for number in finished if number >= stats["shards"])
            if extra:
                last = f"is past this run's last shard ({stats['shards']} in all)"
                raise JournalMismatch(journal.shard_path(extra[0]), last)
            check_unchanged(input_path, before)
            _concatenate([journal.shard_path(k) for k in range(stats["shards"])], output_path)
    except OSError as e:
        raise (write_error(output_path, e) or e) from None
    stats.update(resumed_shards=len(finished), resumed_sentences=sum(finished.values()))
    return stats


def _counted(sentences, stats):
    for sentence in sentences:
        stats["sentences"] += 1
        stats["tokens"] += len(sentence.tokens)
        stats["truncated"] += sentence.truncated
        yield sentence
