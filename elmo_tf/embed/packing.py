"""Sentences into packed rows and batches: the plan every embed run follows, in plain Python and NumPy.

A packed row holds several sentences back to back, each between its own `<S>` and `</S>` (`<S> a b </S> <S> c d e
</S> ...`): `pack_rows` fills rows best-fit (so almost no step of the LSTM loop is spent on padding, whatever the
order of the corpus), `group_rows` groups rows into batches, `iter_batches` / `plan_batches` do both over a stream
of sentence lengths, `iter_plan` over a stream of `elmo_tf.io.sentences.Sentence`s (the one order a run follows),
and `packed_layout` turns a batch into the arrays `Embedder` runs (the served `packed` signature's too).
"""

import bisect

import numpy as np

from elmo_tf.errors import check_int

ROW_LENGTH = 64  # positions per packed row (a sentence of n tokens takes n + 2); longer sentences get a row each
BOUNDARIES = 2  # <S> and </S> around every sentence
# multiply-adds one model call may cost by default: a few seconds on a 2-core AVX2-only AMD EPYC (Zen 3), the slowest
# CPU this project runs on (the original model: 2,905 positions per call; calls of 8,192 took up to 11.5 s there), so
# that SIGTERM, acted on between calls, ends a command within 10 s even with other work on the cores
CALL_MULTIPLY_ADDS = 3 * 10**11
MIN_BATCH_TOKENS = 1024  # a floor for huge models: one call holds at least this many positions (or one piece)


def default_batch_tokens(batch_size, config=None, extra_per_position=0):
    """The default cap on one model call's positions (rows x steps): 128 per row, and at most `CALL_MULTIPLY_ADDS`
    worth of the biLM's work (`config.multiply_adds_per_position()`, plus `extra_per_position`: a language model's
    softmax), never fewer than `MIN_BATCH_TOKENS`. A model call is what SIGTERM waits for (TensorFlow finishes its op
    before Python sees the signal)."""
    positions = 128 * batch_size
    if config is not None:
        per_position = config.multiply_adds_per_position() + extra_per_position
        positions = min(positions, max(MIN_BATCH_TOKENS, CALL_MULTIPLY_ADDS // per_position))
    return positions


def pack_rows(sizes, row_length=ROW_LENGTH):
    """Best-fit decreasing: puts items of `sizes` (positions each) into as few rows of `row_length` as it can.

    An item larger than `row_length` gets a row of its own. Returns a list of rows, each a list of item
    indices, the fullest rows first (rows of similar fill end up in the same batch).
    """
    row_length = check_int("row_length", row_length, 1)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    rows, fill = [], []
    free = []  # sorted (room left, row number) of rows that can still take an item
    for i in order:
        size = sizes[i]
        if size < 1:
            raise ValueError(f"sizes must be positive, got {size} at {i}")
        k = bisect.bisect_left(free, (size, -1))
        if k < len(free):  # the row with the least room that still fits
            room, row = free.pop(k)
            rows[row].append(i)
            fill[row] += size
            if room - size > 0:
                bisect.insort(free, (room - size, row))
            continue
        rows.append([i])
        fill.append(size)
        if row_length - size > 0:
            bisect.insort(free, (row_length - size, len(rows) - 1))
    return [rows[r] for r in sorted(range(len(rows)), key=lambda r: -fill[r])]


def group_rows(row_sizes, batch_size, max_batch_positions=None):
    """Groups consecutive rows into batches of at most `batch_size` rows and `rows x longest <= max_batch_positions`
    positions (a row longer than that is a batch of its own). Returns lists of row numbers."""
    batch_size = check_int("batch_size", batch_size, 1)
    max_batch_positions = check_int("max_batch_positions", max_batch_positions, 1, allow_none=True)
    batches, batch, longest = [], [], 0
    for r, size in enumerate(row_sizes):
        new_longest = max(longest, size)
        if batch and (
            len(batch) == batch_size
            or (max_batch_positions is not None and (len(batch) + 1) * new_longest > max_batch_positions)
        ):
            batches.append(batch)
            batch, new_longest = [], size
        batch.append(r)
        longest = new_longest
    if batch:
        batches.append(batch)
    return batches


def plan_batches(
    lengths,
    batch_size=64,
    max_batch_tokens=None,
    sort=True,
    window=None,
    row_length=ROW_LENGTH,
):
    """Plans packed batches for sentences of `lengths` tokens, in one pass over them (a stream works the same).

    Sentences are gathered into a window, packed into rows (`pack_rows`, positions = tokens + 2) and the rows
    grouped into batches of `batch_size` rows (`group_rows`, at most `max_batch_tokens` positions each). A window
    is packed once it holds `window` sentences (default `50 * batch_size` with `sort`, one batch worth of
    positions without it: corpus order with only as much look-ahead as one batch needs); the rows of a last,
    incomplete batch go back to the window to be packed with the sentences that follow. Empty sentences (length
    0) are not batched; the caller writes them directly.

    Returns:
        list of batches; a batch is a list of rows; a row is a list of sentence indices.
    """
    return list(
        iter_batches(((i, n) for i, n in enumerate(lengths)), batch_size, max_batch_tokens, sort, window, row_length)
    )


def iter_batches(items, batch_size=64, max_batch_tokens=None, sort=True, window=None, row_length=ROW_LENGTH):
    """`plan_batches` over a stream: `items` yields `(key, n_tokens)`; yields batches (lists of rows of keys) as soon
    as they are complete, holding at most about one window of items."""
    batch_size = check_int("batch_size", batch_size, 1)
    row_length = check_int("row_length", row_length, 1)
    max_batch_tokens = check_int("max_batch_tokens", max_batch_tokens, 1, allow_none=True)
    window = check_int("window", window, 1, allow_none=True)
    pending = []  # (key, size in positions)
    filled = 0

    def full():
        if sort:
            return len(pending) >= (window or 50 * batch_size)
        return filled >= (window or batch_size * row_length)

    def flush(final):
        rows = pack_rows([size for _, size in pending], row_length)
        row_sizes = [sum(pending[i][1] for i in row) for row in rows]
        batches = group_rows(row_sizes, batch_size, max_batch_tokens)
        keep = []
        if not final and len(batches[-1]) < batch_size:
            keep = [pending[i] for r in batches.pop() for i in rows[r]]
        done = [[[pending[i][0] for i in rows[r]] for r in batch] for batch in batches]
        return done, keep

    for key, n in items:
        if n < 0:
            raise ValueError(f"lengths must be >= 0, got {n} for {key!r}")
        if n == 0:
            continue
        pending.append((key, n + BOUNDARIES))
        filled += n + BOUNDARIES
        if full():
            done, pending = flush(final=False)
            filled = sum(size for _, size in pending)
            yield from done
    if pending:
        done, _ = flush(final=True)
        yield from done


def packed_layout(row_lengths, token_rows):
    """The packed-row inputs of `Embedder._run` (also the served `packed` signature's, `elmo_tf.saved_model.contract`):
    `row_lengths` is a list of rows, each a list of sentence lengths (tokens, at least 1 each); `token_rows` the
    vector-table row of every token, sentences in order (table rows 0, 1, 2 are padding, `<S>`, `</S>`). Returns
    `(table_rows, starts, positions)`: int32 `(rows, steps)` (each sentence as `<S> tokens </S>`, 0 past a row's
    end), bool `(rows, steps)` (True where a sentence starts), int32 `(tokens, 2)` ((row, step) of every token)."""
    steps = max((sum(n + BOUNDARIES for n in row) for row in row_lengths), default=0)
    table_rows = np.zeros([len(row_lengths), steps], np.int32)
    starts = np.zeros([len(row_lengths), steps], bool)
    positions = np.empty([len(token_rows), 2], np.int32)
    bos, eos = 1, 2
    k = 0
    for r, row in enumerate(row_lengths):
        at = 0
        for n in row:
            starts[r, at] = True
            table_rows[r, at] = bos
            table_rows[r, at + 1 : at + 1 + n] = token_rows[k : k + n]
            table_rows[r, at + 1 + n] = eos
            positions[k : k + n, 0] = r
            positions[k : k + n, 1] = np.arange(at + 1, at + 1 + n)
            at += n + BOUNDARIES
            k += n
    return table_rows, starts, positions


def is_long(sentence, max_sentence_tokens):
    """Whether `sentence` (a `Sentence`) has more than `max_sentence_tokens` tokens (None: no bound), and is split."""
    return max_sentence_tokens is not None and len(sentence.tokens) > max_sentence_tokens


def piece_batches(n_tokens, max_sentence_tokens, batch_size=64, max_batch_tokens=None):
    """The pieces of a line of `n_tokens` tokens split into consecutive pieces of `max_sentence_tokens` tokens (the
    last one shorter), grouped into model calls: yields lists of `(start, stop)` token ranges, each call at most
    `batch_size` pieces and, when `max_batch_tokens` is given, at most that many positions (pieces x (their tokens +
    2)), never fewer than one piece."""
    piece = check_int("max_sentence_tokens", max_sentence_tokens, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    per_call = batch_size
    if max_batch_tokens is not None:
        per_call = max(1, min(batch_size, max_batch_tokens // (min(piece, n_tokens) + BOUNDARIES)))
    starts = range(0, n_tokens, piece)
    for k in range(0, len(starts), per_call):
        yield [(start, min(start + piece, n_tokens)) for start in starts[k : k + per_call]]


def iter_plan(
    sentences, batch_size=64, max_batch_tokens=None, sort=True, row_length=ROW_LENGTH, max_sentence_tokens=None
):
    """The work for a stream of `elmo_tf.io.sentences.Sentence`s, in the one order a run follows: yields
    `(empties, batch)`, the empty sentences read since the previous item and a batch (a list of rows, each a list of
    `Sentence`s; `iter_batches` plans them); the last item's batch is None (the empty lines read last, maybe none).
    A sentence longer than `max_sentence_tokens` (`is_long`) is not packed: it comes alone, as a batch `[[sentence]]`
    of its own, once the sentences read before it are planned (their last batch may be incomplete: memory never holds
    more than one window, whatever the number of long lines); the caller splits it (`piece_batches`).
    The same stream and settings give the same items, however much of it is computed: what makes a resumed run
    follow the uninterrupted one batch for batch."""
    max_sentence_tokens = check_int("max_sentence_tokens", max_sentence_tokens, 1, allow_none=True)
    stream = iter(sentences)
    empties, pending, state = [], {}, {"long": None, "done": False}

    def segment():  # the sentences up to the next long one (kept in `state`) or the end
        for sentence in stream:
            if not sentence.tokens:
                empties.append(sentence)
            elif is_long(sentence, max_sentence_tokens):
                state["long"] = sentence
                return
            else:
                pending[sentence.index] = sentence
                yield sentence.index, len(sentence.tokens)
        state["done"] = True

    def read():
        got, empties[:] = list(empties), []
        return got

    while not state["done"]:
        for batch in iter_batches(segment(), batch_size, max_batch_tokens, sort, row_length=row_length):
            yield read(), [[pending.pop(i) for i in row] for row in batch]
        if state["long"] is not None:
            sentence, state["long"] = state["long"], None
            yield read(), [[sentence]]
    yield list(empties), None
