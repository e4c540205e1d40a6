"""elmo_tf.ner.feature_cache: a cache that looks like ours (its magic, its attributes) but points outside itself (an
external link, to a dataset or to a group; a soft link; a virtual dataset; external storage; a filter plugin) is
refused in one line naming the dataset, before any of its data is read or copied into the next cache; the file is
kept as it was."""

import numpy as np
import pytest
from hdf5_refs_testlib import KINDS, SECRET, make_reference, message_names

from elmo_tf.io.conll import Sentence
from elmo_tf.io.hdf5_safety import HDF5ReferenceError
from elmo_tf.ner.feature_cache import FeatureCache, FeatureCacheError, cached_features

SENTENCES = [Sentence(["EU", "rejects", "it"], ["B-ORG", "O", "O"], 1), Sentence(["Peter"], ["B-PER"], 5)]


class Source:
    """Fake activations `(3, n, 4)` of value n; counts its calls."""

    identity = {"kind": "test"}

    def __init__(self):
        self.calls = 0

    def __call__(self, token_lists, progress=None):
        self.calls += 1
        return [np.full([3, len(t), 4], len(t), np.float32) for t in token_lists]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", ["train", "dev"])  # the entry tampered with, or another one
def test_a_cache_pointing_outside_is_refused(tmp_path, kind, key):
    path, source = tmp_path / "cache.hdf5", Source()
    cached_features(source, SENTENCES, path, key="train")
    before = path.read_bytes()
    name = make_reference(kind, path, "train/0", (3, 3, 4))
    tampered = path.read_bytes()
    with pytest.raises(FeatureCacheError) as info:
        cached_features(source, SENTENCES, path, key=key)
    message = str(info.value)
    assert isinstance(info.value, HDF5ReferenceError) and "\n" not in message
    assert message.startswith(f"{path}: ") and message_names(message, kind, name), message
    assert str(SECRET) not in message
    assert source.calls == 1  # the whole file is checked before any entry is read
    with pytest.raises(FeatureCacheError):  # a write would copy the other entries ("train") into the new file
        FeatureCache(path).write(key, "digest", source([s.tokens for s in SENTENCES]))
    assert path.read_bytes() == tampered != before  # kept, not rebuilt
    assert [name for name in tmp_path.iterdir() if ".tmp-" in name.name] == []
