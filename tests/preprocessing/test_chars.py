"""elmo_tf/preprocessing/chars.py: tokens -> 50 char ids (+1 offset), sentence boundaries."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.preprocessing.chars import (
    BOS_CHAR_IDS,
    EOS_CHAR_IDS,
    MAX_CHARS,
    add_sentence_boundaries,
    tokens_to_char_ids,
    tokens_to_char_ids_numpy,
)

# Shifted ids (+1) written out by hand from the design: begin of word 258+1, end of word 259+1,
# padding 260+1, begin of sentence char 256+1, end of sentence char 257+1.
BOW, EOW, PAD, BOS_CHAR, EOS_CHAR = 259, 260, 261, 257, 258


def expected_ids(raw):
    """Independent spelled-out mapping of one token (bytes) to its 50 shifted ids."""
    if raw == b"":
        return [0] * MAX_CHARS
    if raw == b"<S>":
        return [BOW, BOS_CHAR, EOW] + [PAD] * (MAX_CHARS - 3)
    if raw == b"</S>":
        return [BOW, EOS_CHAR, EOW] + [PAD] * (MAX_CHARS - 3)
    body = [b + 1 for b in raw[:48]]
    return [BOW] + body + [EOW] + [PAD] * (MAX_CHARS - 2 - len(body))


TOKENS = [
    "a",
    "The",
    "ELMo",
    ",",
    ".",
    "naïve",
    "日本語",
    "🙂",
    "Ωmega",
    "x" * 47,
    "x" * 48,
    "y" * 49,
    "z" * 1000,
    "é" * 30,  # 60 bytes: cut at 48 bytes, on a character boundary
    "a" + "é" * 30,  # cut at 48 bytes in the middle of a 2-byte character
    "日" * 20,  # 3-byte characters, the cut falls inside one
    "",
    "<S>",
    "</S>",
    "<s>",
    "<S>x",
    "S",
    "</S",
    "\x00",
    "\x7f",
    "tab\there",
    "a b",
]
BYTE_TOKENS = [b"\xff", b"\xfe\xff", b"caf\xe9", b"\x80" * 60, b"\xc3", b"ok\xff\x00end"]


def all_tokens():
    return [t.encode("utf-8") for t in TOKENS] + BYTE_TOKENS


def test_hand_worked_example():
    ids = tokens_to_char_ids(tf.constant(["a", "", "<S>", "</S>", "é"])).numpy()
    assert ids.dtype == np.int32 and ids.shape == (5, 50)
    assert ids[0].tolist() == [259, 98, 260] + [261] * 47
    assert ids[1].tolist() == [0] * 50
    assert ids[2].tolist() == [259, 257, 260] + [261] * 47
    assert ids[3].tolist() == [259, 258, 260] + [261] * 47
    assert ids[4].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260] + [261] * 46
    np.testing.assert_array_equal(BOS_CHAR_IDS, ids[2])
    np.testing.assert_array_equal(EOS_CHAR_IDS, ids[3])


@pytest.mark.parametrize("raw", all_tokens(), ids=lambda r: repr(r[:12]))
def test_tf_numpy_and_spelled_out_mapping_agree(raw):
    tf_ids = tokens_to_char_ids(tf.constant([raw])).numpy()[0]
    np_ids = tokens_to_char_ids_numpy([raw])[0]
    assert tf_ids.tolist() == expected_ids(raw)
    assert np_ids.tolist() == expected_ids(raw)


def test_str_and_bytes_give_the_same_numpy_ids():
    np.testing.assert_array_equal(
        tokens_to_char_ids_numpy(TOKENS), tokens_to_char_ids_numpy([t.encode("utf-8") for t in TOKENS])
    )


def test_long_tokens_are_cut_at_48_bytes():
    long = "abcdefghij" * 100  # 1,000 characters
    ids = tokens_to_char_ids(tf.constant([long, long[:48], long[:49]])).numpy()
    np.testing.assert_array_equal(ids[0], ids[1])
    np.testing.assert_array_equal(ids[0], ids[2])
    assert ids[0, 48] == ord(long[47]) + 1 and ids[0, 49] == EOW
    assert not np.any(ids[0] == PAD)  # 48 bytes leave no room for padding


def test_random_byte_tokens_match_numpy_twin():
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in rng.integers(1, 120, size=300)]
    tokens += [bytes(rng.integers(32, 127, size=n, dtype=np.uint8)) for n in rng.integers(1, 60, size=100)]
    tf_ids = tokens_to_char_ids(tf.constant(tokens)).numpy()
    np.testing.assert_array_equal(tf_ids, tokens_to_char_ids_numpy(tokens))
    np.testing.assert_array_equal(tf_ids, np.array([expected_ids(t) for t in tokens], np.int32))


def test_any_shape_and_inside_tf_function():
    tokens = np.array(all_tokens()[:24], dtype=object).reshape(2, 3, 4)
    flat = tokens_to_char_ids_numpy(list(tokens.reshape(-1)))

    @tf.function
    def mapped(t):
        return tokens_to_char_ids(t)

    out = mapped(tf.constant(tokens)).numpy()
    assert out.shape == (2, 3, 4, 50)
    np.testing.assert_array_equal(out.reshape(-1, 50), flat)
    assert tokens_to_char_ids(tf.constant("a")).numpy().tolist() == expected_ids(b"a")
    assert tokens_to_char_ids(tf.constant([], tf.string)).shape == (0, 50)


def test_wrong_dtype_raises_type_error_naming_it():
    with pytest.raises(TypeError, match="int32"):
        tokens_to_char_ids(tf.constant([1, 2]))


def _ids(sentences, num_tokens):
    out = np.zeros([len(sentences), num_tokens, MAX_CHARS], np.int32)
    for k, s in enumerate(sentences):
        if s:
            out[k, : len(s)] = tokens_to_char_ids_numpy(s)
    return out


def test_add_sentence_boundaries_places_bos_and_eos():
    sentences = [["a", "b", "c"], ["d"], [], ["e", "f"]]
    out = add_sentence_boundaries(tf.constant(_ids(sentences, 3))).numpy()
    assert out.shape == (4, 5, 50)
    for k, s in enumerate(sentences):
        expected = np.zeros([5, 50], np.int32)
        expected[: len(s) + 2] = tokens_to_char_ids_numpy(["<S>"] + s + ["</S>"])
        np.testing.assert_array_equal(out[k], expected, err_msg=f"sentence {k}: {s}")
    # the empty sentence becomes exactly "<S> </S>"
    np.testing.assert_array_equal(out[2, 0], BOS_CHAR_IDS)
    np.testing.assert_array_equal(out[2, 1], EOS_CHAR_IDS)
    assert not out[2, 2:].any()


def test_add_sentence_boundaries_without_tokens_and_without_sentences():
    out = add_sentence_boundaries(tf.zeros([2, 0, 50], tf.int32)).numpy()
    assert out.shape == (2, 2, 50)
    for k in range(2):
        np.testing.assert_array_equal(out[k], np.stack([BOS_CHAR_IDS, EOS_CHAR_IDS]))
    assert add_sentence_boundaries(tf.zeros([0, 3, 50], tf.int32)).shape == (0, 5, 50)
