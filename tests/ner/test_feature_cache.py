"""elmo_tf.ner.feature_cache: the hdf5 cache of the NER features. It never replaces a file it did not write (data,
notes, a biLM's weights); it is written whole beside the target and renamed, so an interrupted write or a full disk
(a real RLIMIT_FSIZE, and ENOSPC) leaves the previous cache as it was; a damaged cache of ours is rebuilt; an entry
is keyed by the biLM's content (weights changed in place are recomputed, a moved biLM is not) and the sentences."""

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from tiny_models import TINY

from elmo_tf.io.conll import Sentence
from elmo_tf.models.elmo import model_fingerprint
from elmo_tf.ner.feature_cache import CACHE_MAGIC, FeatureCacheError, cached_features
from elmo_tf.ner.features import InProcessFeatures, open_feature_source

REPO_ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [Sentence(["EU", "rejects", "it"], ["B-ORG", "O", "O"], 1), Sentence(["Peter"], ["B-PER"], 5)]


class CountingSource:
    """Deterministic fake activations `(L+1=3, n, 4)`; counts the calls that computed features."""

    def __init__(self, offset=0.0, name="a", width=4):
        self.calls, self.offset, self.width = 0, offset, width
        self.identity = {"kind": "test", "name": name}

    def __call__(self, token_lists, progress=None):
        self.calls += 1
        out = [np.full([3, len(t), self.width], len(t) + self.offset, np.float32) for t in token_lists]
        if progress:
            progress(len(token_lists))
        return out


def assert_features(features, offset=0.0):
    assert [f.shape for f in features] == [(3, 3, 4), (3, 1, 4)]
    np.testing.assert_array_equal(features[0], 3 + offset)
    np.testing.assert_array_equal(features[1], 1 + offset)


def temporaries(directory):
    return [name for name in os.listdir(directory) if ".tmp-" in name]


def test_second_call_reads_the_cache(tmp_path):
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert source.calls == 1
    assert cache.read_bytes().startswith(CACHE_MAGIC)  # marked as ours
    other = CountingSource(offset=1.0, name="b")  # another feature source: recomputed, not served from the cache
    assert_features(cached_features(other, SENTENCES, cache, key="train"), offset=1.0)
    assert other.calls == 1
    changed = [Sentence(["EU", "accepts", "it"], ["B-ORG", "O", "O"], 1), SENTENCES[1]]  # other sentences
    cached_features(other, changed, cache, key="train")
    assert other.calls == 2


@pytest.mark.parametrize("kind", ["conll", "notes", "foreign-hdf5", "symlink-to-notes"])
def test_a_file_that_is_not_a_cache_is_never_replaced(tmp_path, kind):
    """Issue 25 case 1: any file h5py could not open was removed and replaced (the run's --train file, notes.txt),
    and a biLM's weight file got train/dev groups written into it. Now it is refused before any work."""
    if kind == "foreign-hdf5":
        path = tmp_path / "weights.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("char_embed", data=np.arange(12.0).reshape(3, 4))
    else:
        path = tmp_path / ("train.conll" if kind == "conll" else "notes.txt")
        path.write_text("EU B-ORG\nrejects O\n" if kind == "conll" else "my notes\n")
    before = path.read_bytes()
    given = path
    if kind == "symlink-to-notes":
        given = tmp_path / "cache.hdf5"
        given.symlink_to(path)
    source = CountingSource()
    with pytest.raises(FeatureCacheError, match="not a feature cache") as caught:
        cached_features(source, SENTENCES, given, key="train")
    assert str(given) in str(caught.value)
    assert path.read_bytes() == before and source.calls == 0
    assert temporaries(tmp_path) == []


def test_an_interrupted_write_keeps_the_previous_cache(tmp_path, monkeypatch):
    """A write that dies mid-way (Ctrl-C, SIGTERM through elmo_tf.cli.run) leaves the previous file byte for byte
    and no temporary; the entries written before are still served."""
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    cached_features(source, SENTENCES, cache, key="train")
    before = cache.read_bytes()
    real = h5py.Group.create_dataset
    written = []

    def dying(self, name, *args, **kwargs):
        if written:
            raise KeyboardInterrupt
        written.append(name)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", dying)
    with pytest.raises(KeyboardInterrupt):
        cached_features(source, SENTENCES, cache, key="dev")
    monkeypatch.setattr(h5py.Group, "create_dataset", real)
    assert cache.read_bytes() == before and temporaries(tmp_path) == []
    assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert source.calls == 2  # train from the cache; dev computed once, its write interrupted
    assert_features(cached_features(source, SENTENCES, cache, key="dev"))
    assert_features(cached_features(source, SENTENCES, cache, key="dev"))
    assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert source.calls == 3  # both entries kept by the second write


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_cache_of_ours_is_rebuilt(tmp_path, caplog, damage):
    cache, source = tmp_path / "cache.hdf5", CountingSource()
    cached_features(source, SENTENCES, cache, key="train")
    cached_features(source, SENTENCES, cache, key="dev")
    data = cache.read_bytes()
    if damage == "garbage":
        cache.write_bytes(CACHE_MAGIC + b"\x00not an hdf5 file" * 100)
    else:
        cache.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.INFO, logger="elmo_tf.ner.feature_cache"):
        assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert source.calls == 3 and "damaged" in caplog.text, caplog.text
    assert_features(cached_features(source, SENTENCES, cache, key="train"))  # the rebuilt cache
    assert source.calls == 3


FULL_DISK_WRITER = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from elmo_tf.io.conll import Sentence
    from elmo_tf.ner.feature_cache import FeatureCacheError, cached_features

    class Source:
        identity = {"kind": "test", "name": "big"}
        def __call__(self, token_lists, progress=None):
            return [np.ones([3, len(t), 4096], np.float32) for t in token_lists]

    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG
    sentences = [Sentence(["word"] * 50, ["O"] * 50, 1 + 51 * i) for i in range(20)]  # 12 MB of features
    try:
        cached_features(Source(), sentences, sys.argv[1], key="dev")
    except FeatureCacheError as e:
        print(e)
        sys.exit(3)
    """
)


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_cache(tmp_path):
    """A real file size limit (RLIMIT_FSIZE, as `ulimit -f`) while writing: one FeatureCacheError naming the path
    and EFBIG, no h5py destructor tracebacks, no crash, the previous cache intact, no temporary left."""
    cache = tmp_path / "cache.hdf5"
    cached_features(CountingSource(), SENTENCES, cache, key="train")
    before = cache.read_bytes()
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_WRITER, str(cache), str(len(before) + (256 << 10))],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr[-3000:])
    message = result.stdout.strip()
    assert str(cache) in message and "File too large" in message and "previous cache is kept" in message, message
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert cache.read_bytes() == before and temporaries(tmp_path) == []
    source = CountingSource()
    assert_features(cached_features(source, SENTENCES, cache, key="train"))
    assert source.calls == 0


def test_no_space_left_names_the_path_and_keeps_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache.hdf5"
    cached_features(CountingSource(), SENTENCES, cache, key="train")
    before = cache.read_bytes()

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(FeatureCacheError) as caught:
        cached_features(CountingSource(), SENTENCES, cache, key="dev")
    assert str(cache) in str(caught.value) and "No space left on device" in str(caught.value)
    assert "ENOSPC" in str(caught.value)
    assert cache.read_bytes() == before and temporaries(tmp_path) == []


# ------------------------------------------------------------------------------------------------ biLM content


def save_tiny_elmo(directory, seed):
    import keras

    from elmo_tf import BiLMConfig, ELMo, save_elmo

    keras.utils.set_random_seed(seed)
    model = ELMo(BiLMConfig(**TINY))
    model.embed_tokens(np.array([["a", "b"]], dtype=object))  # builds the weights
    save_elmo(model, str(directory))
    return model


def test_weights_changed_in_place_are_not_served_from_the_cache(tmp_path):
    """Issue 25 case 4: the digest held the weights' path, so a biLM rewritten at the same path (same size, same
    mtime here) was answered from the cache. Now the entry is keyed by the weight values."""
    from elmo_tf.io.bilm_hdf5 import save_bilm_weights

    elmo_dir = tmp_path / "elmo"
    save_tiny_elmo(elmo_dir, seed=1)
    cache = tmp_path / "features.hdf5"
    source, _ = open_feature_source(elmo=str(elmo_dir))
    first = cached_features(source, SENTENCES, cache, key="train")
    weights = elmo_dir / "weights.hdf5"
    stat = weights.stat()
    other = save_tiny_elmo(tmp_path / "other", seed=2)
    save_bilm_weights(other, str(weights))  # in place: same path
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    source, _ = open_feature_source(elmo=str(elmo_dir))
    second = cached_features(source, SENTENCES, cache, key="train")
    expected = InProcessFeatures(other)([s.tokens for s in SENTENCES])
    for got, want, old in zip(second, expected, first):
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert np.abs(got - old).max() > 1e-3  # the first biLM's features are not reused


def test_the_same_biLM_elsewhere_reuses_the_cache(tmp_path):
    """The key is the biLM's content, not its paths: a copied biLM directory is served from the cache."""
    save_tiny_elmo(tmp_path / "elmo", seed=1)
    cache = tmp_path / "features.hdf5"
    source, _ = open_feature_source(elmo=str(tmp_path / "elmo"))
    first = cached_features(source, SENTENCES, cache, key="train")
    shutil.copytree(tmp_path / "elmo", tmp_path / "moved")
    moved, _ = open_feature_source(elmo=str(tmp_path / "moved" / "weights.hdf5"))

    def refuse(*args, **kwargs):
        raise AssertionError("features recomputed for the same biLM")

    moved.embedder.embed_batch = refuse
    for got, want in zip(cached_features(moved, SENTENCES, cache, key="train"), first):
        np.testing.assert_array_equal(got, want)


def test_model_fingerprint_follows_the_weight_values(tmp_path):
    from elmo_tf.models import load_elmo

    model = save_tiny_elmo(tmp_path / "elmo", seed=1)
    reloaded = load_elmo(str(tmp_path / "elmo" / "options.json"), str(tmp_path / "elmo" / "weights.hdf5"))
    assert model_fingerprint(model) == model_fingerprint(reloaded)
    variable = reloaded.bilm.weights[0]
    value = np.array(variable.numpy())
    value.flat[0] += 1e-3
    variable.assign(value)
    assert model_fingerprint(model) != model_fingerprint(reloaded)


def test_a_bfloat16_biLM_s_features_are_cached_apart_and_say_their_precision(tmp_path):
    """Issue 51: the same biLM computing in bfloat16 is another feature source (its identity says its precision; a
    float32 identity is what it was before precisions, so caches written then stay valid); each entry records the
    precision its features were computed in; a float32 entry is not served to a bfloat16 source, nor the reverse."""
    save_tiny_elmo(tmp_path / "elmo", seed=1)
    cache = tmp_path / "features.hdf5"
    float32, info = open_feature_source(elmo=str(tmp_path / "elmo"))
    bfloat16, info16 = open_feature_source(elmo=str(tmp_path / "elmo"), precision="bfloat16")
    assert float32.identity == {"kind": "in_process", "sha256": float32.identity["sha256"]}
    assert bfloat16.identity == {**float32.identity, "precision": "bfloat16"}
    assert (info["precision"], info16["precision"]) == ("float32", "bfloat16")
    for source in (float32, bfloat16, float32):
        features = cached_features(source, SENTENCES, cache, key="train")
        np.testing.assert_allclose(features[0], source([s.tokens for s in SENTENCES])[0], atol=1e-6)
        with h5py.File(cache, "r") as f:
            assert f["train"].attrs["precision"] == source.precision
    difference = np.abs(cached_features(bfloat16, SENTENCES, cache, key="dev")[0] - features[0]).max()
    assert 1e-4 < difference < 0.1, difference  # bfloat16's rounding, not float32's
