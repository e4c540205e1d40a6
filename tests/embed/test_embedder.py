"""elmo_tf/embed/embedder.py: packed rows, token vectors shared within a batch and across batches, the same outputs."""

import numpy as np
import pytest

from elmo_tf.embed import Embedder
from elmo_tf.embed.embedder import CNN_TOKENS_MULTIPLE, CNN_WIDTH_PER_TOKEN


def test_packing_memo_and_dedup_change_no_output(tiny_elmo, to_char_ids):
    """Rows packed with other sentences, token vectors shared within a batch (dedup) and across batches (memo):
    every sentence still gets the vectors it gets alone, and the memo really serves later batches."""
    rng = np.random.default_rng(0)
    words = [w.encode() for w in "the a of cat dog <S> </S> İSTANBUL x y z , . big small red".split()] + [b"caf\xe9"]
    sentences = [[words[k] for k in rng.integers(0, len(words), rng.integers(1, 25))] for _ in range(30)]
    plain = Embedder(tiny_elmo, "all", memo_size=0, row_length=16)
    memo = Embedder(tiny_elmo, "all", memo_size=8, row_length=40)
    first = plain.embed_batch(sentences)
    second = memo.embed_batch(sentences[:15]) + memo.embed_batch(sentences[15:])
    assert plain.stats["memo"] == 0 and memo.stats["memo"] > 0
    assert plain.stats["distinct"] < plain.stats["tokens"]
    for s, a, b in zip(sentences, first, second):
        alone = np.stack([np.asarray(x)[0] for x in tiny_elmo(to_char_ids([s]))["activations"]])
        np.testing.assert_allclose(a, alone, atol=1e-6, rtol=0)
        np.testing.assert_allclose(b, alone, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="memo_size"):
        Embedder(tiny_elmo, memo_size=-1)


def test_char_cnn_calls_are_bounded_in_char_positions_shortest_first(tiny_elmo):
    """Fresh tokens go through the char CNN shortest first, and a call with long tokens holds fewer of them: tokens x
    cut width stays within `cnn_chunk * CNN_WIDTH_PER_TOKEN`, so a batch with long tokens needs no more memory than
    a typical one. Vectors as `encode_distinct` gives them."""
    cnn = tiny_elmo.char_cnn
    widest = max(width for width, _ in cnn.filters)
    embedder = Embedder(tiny_elmo, "top", memo_size=0)
    calls, encode = [], embedder._encode

    def spy(ids):
        calls.append((len(ids), int(cnn.token_lengths(ids).max())))
        return encode(ids)

    embedder._encode = spy
    rng = np.random.default_rng(3)
    long = [bytes(rng.integers(97, 123, cnn.max_chars - 4)) for _ in range(300)]  # the full width, uncut
    short = [f"s{k}".encode() for k in range(200)]
    tokens = [t for pair in zip(long, short) for t in pair] + long[200:]
    table, rows = embedder.token_vectors(tokens)
    budget = embedder.cnn_chunk * CNN_WIDTH_PER_TOKEN
    used = [size * min(length + widest - 1, cnn.max_chars) for size, length in calls]
    assert max(used) <= budget, calls
    # shortest first: 256 tokens would take 56 long ones, too wide: 192 short ones, then 96 at a time at the full width
    assert calls == [(192, len(short[-1]) + 2)] + [(96, cnn.max_chars)] * 3 + [(32, cnn.max_chars)], calls
    expected = cnn.encode_distinct(tiny_elmo.char_mapping.numpy(tokens)).numpy()
    np.testing.assert_allclose(table[rows], expected, atol=1e-6, rtol=0)


def test_char_cnn_calls_are_padded_to_a_few_sizes_and_give_the_same_vectors(tiny_elmo):
    """Each char-CNN call of the Embedder holds a multiple of CNN_TOKENS_MULTIPLE tokens (all-zero rows added, their
    vectors dropped), so a long run meets few shapes; every token's vector is the one `encode_distinct` gives it."""
    embedder = Embedder(tiny_elmo, "top", memo_size=0, cnn_chunk=100)
    sizes, encode = [], embedder._encode

    def spy(ids):
        sizes.append(len(ids))
        return encode(ids)

    embedder._encode = spy
    tokens = [f"w{k}".encode() for k in range(137)]  # 137 distinct: chunks of 100 and 37
    table, rows = embedder.token_vectors(tokens + tokens[:5])
    assert sizes == [128, 64], sizes  # 100 -> 128, 37 -> 64
    assert all(size % CNN_TOKENS_MULTIPLE == 0 for size in sizes)
    expected = tiny_elmo.char_cnn.encode_distinct(tiny_elmo.char_mapping.numpy(tokens)).numpy()
    np.testing.assert_allclose(table[rows[:137]], expected, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(rows[137:], rows[:5])


def test_a_bfloat16_model_embeds_as_it_computes_alone(make_elmo, to_char_ids):
    """Packed rows, shared token vectors and the memo change nothing in bfloat16 either (exactly where TF's bfloat16
    matmul is emulated, as on the AVX2 EPYC; to bfloat16's error where a CPU's own kernels may sum in another
    order); the embedder computes in its model's precision and refuses another."""
    from elmo_tf.layers import low_precision
    from elmo_tf.precision import PrecisionError

    model = make_elmo(precision="bfloat16")
    atol = 1e-6 if low_precision.emulated("matmul") else 1e-2
    rng = np.random.default_rng(1)
    words = [w.encode() for w in "the a of cat dog İSTANBUL x y , . big red".split()]
    sentences = [[words[k] for k in rng.integers(0, len(words), rng.integers(1, 20))] for _ in range(12)]
    embedder = Embedder(model, "all", memo_size=8, row_length=32, precision="bfloat16")
    assert embedder.precision == "bfloat16" == Embedder(model).precision
    first = embedder.embed_batch(sentences[:6]) + embedder.embed_batch(sentences[6:])
    assert embedder.stats["memo"] > 0
    for s, got in zip(sentences, first):
        alone = np.stack([np.asarray(x)[0] for x in model(to_char_ids([s]))["activations"]])
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, alone, atol=atol, rtol=0)
    with pytest.raises(PrecisionError, match="precision 'float32' computes in float32, but the model computes in"):
        Embedder(model, precision="float32")
    with pytest.raises(PrecisionError, match="got 'half'"):
        Embedder(model, precision="half")
