"""elmo_tf/preprocessing/lm_dataset.py: deterministic order (across processes, and under `skip`), bad lines,
long lines cut into pieces, token ids through the vocabulary, char ids as raw bytes + 1, sharding."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from elmo_tf.bounds import MAX_BUFFER
from elmo_tf.preprocessing.chars import tokens_to_char_ids_numpy
from elmo_tf.preprocessing.lm_dataset import (
    LMDataError,
    check_has_tokens,
    lm_dataset,
    vocabulary_table,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<S>", "</S>", "<UNK>"]


def write_corpus(path, n_lines=40, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{k}" for k in range(30)]
    lines = [" ".join(rng.choice(words, size=rng.integers(1, 25))) for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n")
    return lines, SPECIALS + words


def batches(ds, n=None):
    """The first `n` batches (all when None) as lists of numpy arrays."""
    out = []
    for k, b in enumerate(ds):
        if n is not None and k >= n:
            break
        out.append({key: v.numpy() for key, v in b.items()})
    return out


def sentences(batch_list, vocab):
    """Token-id batches -> list of word tuples (padding dropped, using the char ids for the mask)."""
    result = []
    for b in batch_list:
        mask = (b["char_ids"] > 0).any(-1)
        for ids, m in zip(b["token_ids"], mask):
            result.append(tuple(vocab[i] for i in ids[m]))
    return result


HASH_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import keras
    from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table
    path, words = sys.argv[1], open(sys.argv[2]).read().split()
    for seed in (0, 1):
        keras.utils.set_random_seed(seed)  # as training/pretrain.py does before building the pipeline
        ds = lm_dataset([path], vocabulary_table(words), 4, max_tokens=10, shuffle_buffer=100, seed=seed)
        h = hashlib.sha256()
        for k, b in enumerate(ds.take(20)):
            h.update(b["token_ids"].numpy().tobytes()); h.update(b["char_ids"].numpy().tobytes())
        print(f"seed {seed} {k + 1} {h.hexdigest()}")
""")


@pytest.mark.slow
def test_same_seed_same_batches_in_separate_processes(tmp_path):
    _, vocab = write_corpus(tmp_path / "train.txt")
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, "-c", HASH_SCRIPT, str(tmp_path / "train.txt"), str(tmp_path / "vocab.txt")]
    procs = [
        subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert proc.returncode == 0, err
        outputs.append(out.split("\n"))
    lines = [line for line in outputs[0] if line.startswith("seed")]
    assert len(lines) == 2 and all(" 20 " in line for line in lines), outputs[0]  # 20 batches, several epochs
    assert outputs[0] == outputs[1]
    assert lines[0].split()[-1] != lines[1].split()[-1]  # the seed does change the order


def test_skip_then_continue_equals_uninterrupted(tmp_path):
    _, vocab = write_corpus(tmp_path / "train.txt")
    table = vocabulary_table(vocab)

    def make():  # a fresh dataset, as a resumed process builds it
        return lm_dataset([str(tmp_path / "train.txt")], table, 4, max_tokens=10, shuffle_buffer=100, seed=7)

    # 40 lines of up to 24 tokens -> ~ 70 pieces -> ~ 20 batches an epoch: 45 batches cross two epoch ends
    full = batches(make(), 45)
    for n in (1, 13, 30):
        resumed = batches(make().skip(n), 45 - n)
        assert len(resumed) == 45 - n
        for a, b in zip(full[n:], resumed):
            np.testing.assert_array_equal(a["token_ids"], b["token_ids"])
            np.testing.assert_array_equal(a["char_ids"], b["char_ids"])
    # shuffled: the order is not the file order, and a second epoch is not a copy of the first
    assert sentences(full[:3], vocab) != sentences(
        batches(lm_dataset([str(tmp_path / "train.txt")], table, 4, max_tokens=10, shuffle_buffer=0), 3), vocab
    )


def test_one_pass_covers_every_piece_once(tmp_path):
    lines, vocab = write_corpus(tmp_path / "train.txt")
    ds = lm_dataset(
        [str(tmp_path / "train.txt")],
        vocabulary_table(vocab),
        3,
        max_tokens=10,
        shuffle_buffer=50,
        seed=3,
        repeat=False,
    )
    got = batches(ds)
    expected = []
    for line in lines:
        words = line.split()
        expected += [tuple(words[k : k + 10]) for k in range(0, len(words), 10)]
    assert sorted(sentences(got, vocab)) == sorted(expected)
    for b in got:
        assert b["char_ids"].shape[0] <= 3 and b["char_ids"].shape[1] <= 10 and b["char_ids"].shape[2] == 50
        assert b["char_ids"].dtype == np.int32 and b["token_ids"].dtype == np.int32


def test_empty_and_whitespace_lines_are_skipped(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes(b"\n   \nthe cat\n\t \t\n\r\n\nsat on\n  mat  \n\n")
    vocab = SPECIALS + ["the", "cat", "sat", "on", "mat"]
    got = sentences(
        batches(lm_dataset([str(path)], vocabulary_table(vocab), 16, shuffle_buffer=0, repeat=False)), vocab
    )
    assert sorted(got) == sorted([("the", "cat"), ("sat", "on"), ("mat",)])


def test_non_utf8_bytes_survive(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes(b"caf\xe9 ok \xff\xfe\n")
    vocab = SPECIALS + ["ok"]
    (b,) = batches(lm_dataset([str(path)], vocabulary_table(vocab), 4, shuffle_buffer=0, repeat=False))
    np.testing.assert_array_equal(b["token_ids"], [[2, 3, 2]])  # unknown (not decodable) words -> <UNK>
    # char ids: begin-of-word 259, each raw byte + 1, end-of-word 260, padding 261
    np.testing.assert_array_equal(
        b["char_ids"][0, 0, :7], [259, ord("c") + 1, ord("a") + 1, ord("f") + 1, 0xE9 + 1, 260, 261]
    )
    np.testing.assert_array_equal(b["char_ids"][0, 2, :5], [259, 0xFF + 1, 0xFE + 1, 260, 261])
    np.testing.assert_array_equal(b["char_ids"][0], tokens_to_char_ids_numpy([b"caf\xe9", b"ok", b"\xff\xfe"]))


@pytest.mark.parametrize("max_tokens", [64, 50])
def test_10000_token_line_is_cut_into_pieces(tmp_path, max_tokens):
    words = [f"t{k}" for k in range(10000)]
    path = tmp_path / "long.txt"
    path.write_text("short line\n" + " ".join(words) + "\nanother\n")
    vocab = SPECIALS + words
    got = batches(
        lm_dataset([str(path)], vocabulary_table(vocab), 32, max_tokens=max_tokens, shuffle_buffer=0, repeat=False)
    )
    pieces = [s for s in sentences(got, vocab) if s and s[0].startswith("t")]
    assert len(pieces) == math.ceil(10000 / max_tokens)
    assert sorted(pieces, key=lambda s: int(s[0][1:])) == [
        tuple(words[k : k + max_tokens]) for k in range(0, 10000, max_tokens)
    ]
    assert max(b["token_ids"].shape[1] for b in got) == max_tokens


@pytest.mark.parametrize("width", [1, 2, 10])
def test_bucket_width_bounds_the_padding(tmp_path, width):
    """A batch holds sentences whose lengths differ by less than `bucket_width` and is padded to its longest, so
    no row carries `bucket_width` or more padding positions; every piece still comes once."""
    lines, vocab = write_corpus(tmp_path / "train.txt", n_lines=200)
    got = batches(
        lm_dataset(
            [str(tmp_path / "train.txt")],
            vocabulary_table(vocab),
            8,
            shuffle_buffer=0,
            repeat=False,
            bucket_width=width,
        )
    )
    spans = []
    for b in got:
        lengths = (b["char_ids"] > 0).any(-1).sum(1)
        assert lengths.max() == b["token_ids"].shape[1]
        spans.append(int(lengths.max() - lengths.min()))
    assert max(spans) < width
    if width == 10:
        assert max(spans) > 2  # the wide buckets do mix lengths (the narrow ones' bound is not vacuous)
    assert sorted(sentences(got, vocab)) == sorted(tuple(line.split()) for line in lines)


def test_bucket_width_must_be_positive(tmp_path):
    _, vocab = write_corpus(tmp_path / "train.txt")
    with pytest.raises(ValueError, match="bucket_width must be >= 1, got 0"):
        lm_dataset([str(tmp_path / "train.txt")], vocabulary_table(vocab), 4, bucket_width=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(shuffle_buffer=-1), "shuffle_buffer must be >= 0, got -1"),  # was tf.data's InvalidArgumentError
        (dict(shuffle_buffer=MAX_BUFFER + 1), f"shuffle_buffer must be <= {MAX_BUFFER} (tf.data reserves memory"),
        (dict(batch_size=MAX_BUFFER + 1), f"batch_size must be <= {MAX_BUFFER} (tf.data reserves memory"),
        (dict(batch_size=0), "batch_size must be >= 1, got 0"),
        (dict(batch_size=4.0), "batch_size must be an int, got 4.0"),
        (dict(max_tokens=2**31), "max_tokens must be <= 2147483647 (int32), got 2147483648"),
        (dict(bucket_width=True), "bucket_width must be an int, got True"),
    ],
)
def test_sizes_out_of_range_are_named(tmp_path, kwargs, message):
    _, vocab = write_corpus(tmp_path / "train.txt")
    kwargs = dict(dict(batch_size=4), **kwargs)
    with pytest.raises(ValueError) as info:
        lm_dataset([str(tmp_path / "train.txt")], vocabulary_table(vocab), **kwargs)
    assert message in str(info.value)


def test_the_largest_sizes_work_without_padding_to_max_tokens(tmp_path):
    """max_tokens at int32's largest (pieces were padded to max_tokens: n + max_tokens overflowed int32, and a line
    of 5 tokens became a tensor of max_tokens strings) and a batch of MAX_BUFFER sentences: one pass gives every
    line whole, in batches padded to their longest sentence only."""
    lines, vocab = write_corpus(tmp_path / "train.txt", n_lines=30)
    ds = lm_dataset(
        [str(tmp_path / "train.txt")],
        vocabulary_table(vocab),
        MAX_BUFFER,
        max_tokens=2**31 - 1,
        bucket_width=2**31 - 1,
        shuffle_buffer=0,
        repeat=False,
    )
    (batch,) = batches(ds)  # one bucket, one batch
    assert sentences([batch], vocab) == [tuple(line.split()) for line in lines]
    assert batch["token_ids"].shape == (30, max(len(line.split()) for line in lines))


def test_check_has_tokens_names_the_blank_files(tmp_path):
    blank, other, good = tmp_path / "blank.txt", tmp_path / "other.txt", tmp_path / "good.txt"
    blank.write_bytes(b"\n \n\t\r\n" * 100)
    other.write_bytes(b"")
    good.write_bytes(b"\n" * 1000 + b"  word\n")
    with pytest.raises(LMDataError, match=f"no tokens in {str(blank)!r}: every line is blank") as info:
        check_has_tokens([str(blank)])
    assert info.value.files == [str(blank)]
    with pytest.raises(LMDataError, match="no tokens in any of the 2 files"):
        check_has_tokens([str(blank), str(other)])
    check_has_tokens([str(blank), str(other), str(good)])  # a token in any file is enough


def test_token_ids_through_vocabulary(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("the cat sat on the mat\nthe zebra <S> </S> <UNK>\n")
    vocab = SPECIALS + ["the", "cat", "sat", "on"]
    (b,) = batches(
        lm_dataset([str(path)], vocabulary_table(vocab), 4, shuffle_buffer=0, repeat=False, bucket_width=100)
    )
    ids = b["token_ids"]
    mask = (b["char_ids"] > 0).any(-1)
    rows = {tuple(r[m].tolist()) for r, m in zip(ids, mask)}
    assert rows == {(3, 4, 5, 6, 3, 2), (3, 2, 0, 1, 2)}
    assert ids.shape == (2, 6) and ids[1, 5] == 0 and not mask[1, 5]  # padding: id 0, all-zero char row
    assert not b["char_ids"][1, 5].any()


def test_shards_split_the_lines(tmp_path):
    lines, vocab = write_corpus(tmp_path / "train.txt", n_lines=21)
    table = vocabulary_table(vocab)
    shards = [
        sentences(
            batches(
                lm_dataset(
                    [str(tmp_path / "train.txt")],
                    table,
                    4,
                    max_tokens=100,
                    shuffle_buffer=0,
                    repeat=False,
                    num_shards=2,
                    shard_index=k,
                )
            ),
            vocab,
        )
        for k in (0, 1)
    ]
    assert sorted(shards[0]) == sorted(tuple(line.split()) for line in lines[0::2])
    assert sorted(shards[1]) == sorted(tuple(line.split()) for line in lines[1::2])
