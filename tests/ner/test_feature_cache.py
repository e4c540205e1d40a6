"""elmo_tf.ner.features.cached_features: the hdf5 cache is written data first and digest last; an interrupted write,
a cache made for other inputs and a damaged file are all recomputed (with a log line), never read as features."""

import logging

import h5py
import numpy as np
import pytest

from elmo_tf.io.conll import Sentence
from elmo_tf.ner.features import cached_features

SENTENCES = [Sentence(["EU", "rejects", "it"], ["B-ORG", "O", "O"], 1), Sentence(["Peter"], ["B-PER"], 5)]


class CountingSource:
    """Deterministic fake activations `(L+1=3, n, 4)`; counts the sentences it computed."""

    def __init__(self, offset=0.0):
        self.calls, self.offset = 0, offset

    def __call__(self, token_lists, progress=None):
        self.calls += 1
        out = [np.full([3, len(t), 4], len(t) + self.offset, np.float32) for t in token_lists]
        if progress:
            progress(len(token_lists))
        return out


def assert_features(features, offset=0.0):
    assert [f.shape for f in features] == [(3, 3, 4), (3, 1, 4)]
    np.testing.assert_array_equal(features[0], 3 + offset)


def test_second_call_reads_the_cache(tmp_path):
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))
    assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))
    assert source.calls == 1
    other = CountingSource(offset=1.0)  # another feature source: recomputed, not served from the cache
    assert_features(cached_features(other, SENTENCES, cache, key="train", source_info="b"), offset=1.0)
    assert other.calls == 1


def test_an_interrupted_write_is_recomputed(tmp_path, monkeypatch, caplog):
    """A write that dies after the first sentence leaves a group without a digest: the next run recomputes it."""
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    real = h5py.Group.create_dataset
    written = []

    def dying(self, name, *args, **kwargs):
        if written:
            raise KeyboardInterrupt  # as Ctrl-C or SIGTERM (elmo_tf.cli.run) would, mid-way
        written.append(name)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", dying)
    with pytest.raises(KeyboardInterrupt):
        cached_features(source, SENTENCES, cache, key="train", source_info="a")
    monkeypatch.setattr(h5py.Group, "create_dataset", real)
    with h5py.File(cache, "r") as f:
        assert list(f["train"]) == ["0"] and "digest" not in f["train"].attrs  # data first, digest never written
    with caplog.at_level(logging.INFO, logger="elmo_tf.ner.features"):
        assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))
    assert source.calls == 2 and "was interrupted" in caplog.text
    assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))
    assert source.calls == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_cache_file_is_rebuilt(tmp_path, caplog, damage):
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    cached_features(source, SENTENCES, cache, key="train", source_info="a")
    cached_features(source, SENTENCES, cache, key="dev", source_info="a")
    if damage == "garbage":
        cache.write_bytes(b"\x00not an hdf5 file" * 100)
    else:
        data = cache.read_bytes()
        cache.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.INFO, logger="elmo_tf.ner.features"):
        assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))
    assert source.calls == 3 and ("damaged" in caplog.text or "cannot be opened" in caplog.text), caplog.text
    assert_features(cached_features(source, SENTENCES, cache, key="train", source_info="a"))  # the rebuilt cache
    assert source.calls == 3
