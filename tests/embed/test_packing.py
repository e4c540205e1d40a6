"""elmo_tf/embed/packing.py: sentences packed into rows and rows grouped into batches, within their limits."""

import numpy as np
import pytest

from elmo_tf.embed import iter_batches, pack_rows, plan_batches


def check_plan(batches, lengths, batch_size, max_batch_tokens, row_length):
    flat = [i for batch in batches for row in batch for i in row]
    non_empty = [i for i, n in enumerate(lengths) if n > 0]
    assert sorted(flat) == non_empty  # every non-empty sentence exactly once, empty ones never
    for batch in batches:
        assert 1 <= len(batch) <= batch_size
        sizes = [sum(lengths[i] + 2 for i in row) for row in batch]
        if max_batch_tokens is not None and len(batch) > 1:
            assert len(batch) * max(sizes) <= max_batch_tokens
        for row, size in zip(batch, sizes):
            assert size <= row_length or len(row) == 1  # only a sentence longer than a row gets a longer row


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "file-order"])
@pytest.mark.parametrize(
    "batch_size,max_batch_tokens,row_length", [(1, None, 64), (7, None, 16), (64, None, 64), (7, 60, 32), (64, 200, 64)]
)
def test_plan_covers_every_sentence_once_within_limits(batch_size, max_batch_tokens, row_length, sort):
    lengths = [int(n) for n in np.random.default_rng(batch_size).integers(0, 40, size=300)]
    batches = plan_batches(lengths, batch_size, max_batch_tokens, sort, row_length=row_length)
    check_plan(batches, lengths, batch_size, max_batch_tokens, row_length)


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "file-order"])
def test_packed_rows_leave_little_padding_in_any_order(sort):
    """The point of packing: in file order too, almost every LSTM step of a batch is a real position."""
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 40, size=2000)]
    batches = plan_batches(lengths, batch_size=32, sort=sort, row_length=64)
    real = sum(n + 2 for n in lengths)
    padded = sum(len(b) * max(sum(lengths[i] + 2 for i in row) for row in b) for b in batches)
    assert real / padded > 0.95
    # sentences of one batch are padded to its longest without packing: far more waste
    plain = sum(32 * max(lengths[k : k + 32]) + 64 for k in range(0, 2000, 32))
    assert real / plain < 0.7


def test_pack_rows_best_fit():
    assert pack_rows([3, 3, 2, 5, 1], row_length=6) == [[3, 4], [0, 1], [2]]  # 5+1, 3+3, 2
    assert pack_rows([9, 2], row_length=4) == [[0], [1]]  # too long: a row of its own
    rows = pack_rows([int(n) for n in np.random.default_rng(0).integers(1, 20, size=500)], row_length=40)
    assert sorted(i for row in rows for i in row) == list(range(500))


def test_a_stream_is_planned_with_bounded_look_ahead():
    """iter_batches never holds more than about one window of sentences, and in file order it yields a batch as
    soon as one batch of positions has been read."""
    read = []

    def stream():
        for i, n in enumerate(np.random.default_rng(2).integers(1, 30, size=3000)):
            read.append(i)
            yield i, int(n)

    emitted = 0
    for batch in iter_batches(stream(), batch_size=8, sort=False, row_length=64):
        emitted += sum(len(row) for row in batch)
        assert len(read) - emitted < 8 * 64  # fewer pending sentences than one batch has positions
    assert emitted == 3000
    read.clear()
    emitted = 0
    for batch in iter_batches(stream(), batch_size=8, sort=True, window=100, row_length=64):
        emitted += sum(len(row) for row in batch)
        assert len(read) - emitted <= 100 + 8 * 64
    assert emitted == 3000


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([1, 2], batch_size=0)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_batches([1, 2], batch_size=2, max_batch_tokens=0)
    with pytest.raises(ValueError, match="row_length"):
        plan_batches([1, 2], batch_size=2, row_length=0)
    with pytest.raises(ValueError, match="lengths"):
        plan_batches([1, -2], batch_size=2)
    assert plan_batches([0, 0], batch_size=2) == []


def test_a_long_sentence_comes_alone_after_the_sentences_before_it_and_is_cut_into_bounded_calls():
    """`iter_plan(max_sentence_tokens=N)`: a sentence of more than N tokens is a batch `[[sentence]]` of its own,
    once those read before it are planned (memory never holds more than a window, whatever the long lines);
    `piece_batches` cuts it into calls of at most `max_batch_tokens` positions (one piece at least)."""
    from elmo_tf.embed.packing import iter_plan, piece_batches
    from elmo_tf.io.sentences import Sentence

    lengths = [3, 5, 40, 2, 0, 41, 1]
    sentences = [Sentence(i, b"", [b"w"] * n, False) for i, n in enumerate(lengths)]
    items = list(iter_plan(iter(sentences), batch_size=2, max_batch_tokens=None, sort=True, max_sentence_tokens=10))
    batches = [[[s.index for s in row] for row in batch] for _, batch in items if batch]
    longs = [k for k, batch in enumerate(batches) if batch in ([[2]], [[5]])]
    assert [batches[k] for k in longs] == [[[2]], [[5]]]
    flat = sorted(i for batch in batches for row in batch for i in row)
    assert flat == [0, 1, 2, 3, 5, 6]  # every non-empty sentence once
    before_2 = {i for batch in batches[: longs[0]] for row in batch for i in row}
    assert before_2 == {0, 1}  # the sentences read before the long one are planned first
    assert [s.index for empties, _ in items for s in empties] == [4]
    assert list(piece_batches(25, 10, batch_size=64, max_batch_tokens=24)) == [[(0, 10), (10, 20)], [(20, 25)]]
    assert list(piece_batches(25, 10, batch_size=64, max_batch_tokens=5)) == [[(0, 10)], [(10, 20)], [(20, 25)]]
    assert list(piece_batches(5, 10, batch_size=1)) == [[(0, 5)]]


def test_a_call_of_a_big_model_is_bounded_by_its_work():
    """One model call is what SIGTERM waits for: the default cap on its positions keeps the original model's call
    near CALL_MULTIPLY_ADDS (2,905 positions, not 8,192: 10.75 s measured for 8,192), leaves small models at 128 a
    row, and never goes below MIN_BATCH_TOKENS (an 800k-word softmax on top)."""
    from elmo_tf.config import BiLMConfig, get_config
    from elmo_tf.embed.packing import CALL_MULTIPLY_ADDS, MIN_BATCH_TOKENS, default_batch_tokens

    original = BiLMConfig()
    cap = default_batch_tokens(64, original)
    assert cap == CALL_MULTIPLY_ADDS // original.multiply_adds_per_position() == 2905
    assert (cap + 1) * original.multiply_adds_per_position() > CALL_MULTIPLY_ADDS
    assert default_batch_tokens(64, get_config("small")) == default_batch_tokens(64) == 128 * 64
    assert default_batch_tokens(8, original) == 128 * 8
    assert default_batch_tokens(64, original, extra_per_position=2 * 793_471 * 512) == MIN_BATCH_TOKENS
