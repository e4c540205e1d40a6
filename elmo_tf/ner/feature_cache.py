"""The NER feature cache: the ELMo features of every split in one hdf5 file, reused while the sentences and the biLM's
content are the same.

The file is marked as ours in its first bytes (`CACHE_MAGIC`, in the HDF5 user block) and by the attributes `format`
and `format_version`. A path holding anything else (a data file, notes, a biLM's weights) is refused, never
replaced; a damaged cache of ours is rebuilt. An entry (a split) is keyed by a digest of the feature layout, the
source's `identity` (for a biLM in this process the sha256 of its options and weight values, not their paths, and
the precision it computes in unless float32) and the sentences' tokens; an entry of a biLM in this process records
that precision in its attribute `precision` ("float32" or "bfloat16"); a served source's entry also holds the
features of `PROBE_TOKENS`, compared within `PROBE_ATOL` (the server's version number alone does not say its weights
are the same).

Each write makes a whole new file beside the target and renames it over (`elmo_tf.io.atomic`): a reader sees the
old cache or the new one. The new file's size is reserved on disk before HDF5 writes anything, so a full disk fails
there with an OSError (reported as `FeatureCacheError`, the temporary removed, the previous cache kept) and never in
HDF5's own writes, whose errors h5py reports from object destructors and may crash on.
"""

import errno
import hashlib
import json
import logging
import os

import h5py
import numpy as np

from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.io.atomic import atomic_path
from elmo_tf.io.hdf5_safety import HDF5ReferenceError, check_self_contained
from elmo_tf.ner.features import SentenceTooLongError

logger = logging.getLogger(__name__)

FEATURES_LAYOUT = 1  # (L+1, n, 2P), token layer duplicated: part of every digest
PROBE_ATOL = 1e-3  # the same biLM: within float rounding (~1e-6, batching); another biLM: differences of 0.1 and more

CACHE_MAGIC = b"elmo_tf NER feature cache\n"  # the first bytes of every cache file (its HDF5 user block)
CACHE_FORMAT = "elmo_tf.ner.feature_cache"
CACHE_VERSION = 2  # 1: the unmarked caches before, keyed by the biLM's paths
USER_BLOCK = 512
DATASET_OVERHEAD = 4096  # bytes reserved per dataset beyond its data (about 380 measured: header, link, B-tree)


class FeatureCacheError(ElmoTFError):
    """A cache path that cannot be used or written; the message names the path and why, in one line."""


class FeatureCacheReferenceError(FeatureCacheError, HDF5ReferenceError):
    """A cache file that points outside itself (an external or soft link, a virtual dataset, external storage, a
    filter plugin: `elmo_tf.io.hdf5_safety`): refused, not rebuilt, before any of its data is read (a file made to
    look like ours would otherwise have another file's bytes read, or copied into the next cache)."""


# what h5py raises for a damaged cache (rebuilt); FeatureCacheReferenceError, a ValueError, is re-raised before
_DAMAGED = (OSError, RuntimeError, KeyError, ValueError)


def is_feature_cache(path):
    """True when `path` begins with `CACHE_MAGIC`: a file `FeatureCache` wrote (damaged or not)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(CACHE_MAGIC)) == CACHE_MAGIC
    except OSError:
        return False


def check_cache_path(path):
    """Raises `FeatureCacheError` unless `path` may be written as a feature cache: absent, or a cache of ours (a
    damaged one included). Anything else is never replaced."""
    if os.path.isdir(path):
        raise FeatureCacheError(f"{path!r} is a directory")
    if not os.path.lexists(path):
        return
    if not os.path.exists(path):
        raise FeatureCacheError(f"{path!r} is a symbolic link to nothing ({os.readlink(path)!r})")
    if not os.path.isfile(path):
        raise FeatureCacheError(f"{path!r} is not a regular file")
    if not is_feature_cache(path):
        raise FeatureCacheError(
            f"{path!r} exists and is not a feature cache written by elmo_tf (caches of versions before the "
            f"format was marked included); it is not replaced: remove it yourself or give another path"
        )


def _reserve(fileobj, size):
    """Allocates `size` bytes for an open file (a full disk raises OSError here, not in HDF5's writes)."""
    try:
        os.posix_fallocate(fileobj.fileno(), 0, size)
        return
    except AttributeError:  # no posix_fallocate on this platform: write the bytes
        pass
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    fileobj.seek(0, os.SEEK_END)
    zeros = bytes(1 << 20)
    while fileobj.tell() < size:
        fileobj.write(zeros[: size - fileobj.tell()])
    fileobj.flush()


def _create_cache_file(path, size):
    """An empty, marked cache file at `path` with `size` bytes reserved. Its HDF5 skeleton is built in memory, so
    HDF5 itself never writes outside reserved space: its write errors (a full disk) cannot be recovered from (h5py
    reports them from object destructors and may crash)."""
    with h5py.File("skeleton", "w", driver="core", backing_store=False, userblock_size=USER_BLOCK) as f:
        f.attrs["format"] = CACHE_FORMAT
        f.attrs["format_version"] = CACHE_VERSION
        f.flush()
        image = f.id.get_file_image()
    with open(path, "xb") as out:
        out.write(CACHE_MAGIC.ljust(USER_BLOCK, b"\0"))
        out.write(image)
        out.flush()
        _reserve(out, max(size, USER_BLOCK + len(image)))


class FeatureCache:
    """The feature cache at `path` (see the module docstring). Layout: the user block (`CACHE_MAGIC`, zeros), root
    attributes `format` and `format_version`, one group per key (split) holding datasets "0".."n-1" (each
    sentence's `(L+1, n_tokens, dim)` float32), attribute `digest`, for a biLM in this process attribute `precision`
    (what its features were computed in), and for a served source a dataset `probe`.

    Raises:
        FeatureCacheError: `path` exists and is not a cache of ours (see `check_cache_path`).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.target = os.path.realpath(self.path)  # a link to a cache: the cache is rewritten, the link kept
        check_cache_path(self.path)

    def read(self, key, digest, count, probe=None):
        """The arrays of `key`, or None when absent, made for other inputs, or the file is damaged (logged).

        Raises:
            FeatureCacheReferenceError: the file points outside itself (checked before any data is read).
        """
        if not os.path.exists(self.target):
            return None
        check_cache_path(self.target)
        try:
            with h5py.File(self.target, "r") as f:
                check_self_contained(f, self.path, FeatureCacheReferenceError)
                if f.attrs.get("format_version") != CACHE_VERSION:
                    logger.info("feature cache %s: another format version; recomputing", self.path)
                    return None
                group = f.get(key)
                if group is None:
                    return None
                if group.attrs.get("digest") != digest:
                    logger.info("feature cache %s: %r was made for other inputs; recomputing it", self.path, key)
                    return None
                if probe is not None and not _same_probe(group, probe):
                    logger.info("feature cache %s: %r was made by another biLM (probe); recomputing it", self.path, key)
                    return None
                return [group[str(i)][...] for i in range(count)]
        except HDF5ReferenceError:
            raise
        except _DAMAGED as e:
            logger.warning("feature cache %s is damaged (%s: %s); rebuilding it", self.path, type(e).__name__, e)
            return None

    def _kept_groups(self, key):
        """(names, bytes, datasets) of the complete groups other than `key` in the current file ([] if unreadable)."""
        names, size, datasets = [], 0, 0
        if not os.path.exists(self.target):
            return names, size, datasets
        try:
            with h5py.File(self.target, "r") as f:
                check_self_contained(f, self.path, FeatureCacheReferenceError)
                if f.attrs.get("format_version") != CACHE_VERSION:
                    return [], 0, 0
                for name, group in f.items():
                    if name == key or "digest" not in group.attrs:
                        continue
                    names.append(name)
                    for dataset in group.values():
                        size += dataset.id.get_storage_size()
                        datasets += 1
        except HDF5ReferenceError:
            raise
        except _DAMAGED:
            return [], 0, 0
        return names, size, datasets

    def write(self, key, digest, features, probe=None, precision=None):
        """Replaces `key`'s arrays (the other complete groups are kept), atomically; `precision`, when given, is
        recorded as the group's attribute `precision`.

        Raises:
            FeatureCacheError: the file cannot be written (a full disk: ENOSPC, EFBIG, EDQUOT); the previous cache is
                unchanged and the temporary removed. FeatureCacheReferenceError: the previous cache points outside
                itself (it is kept, nothing is written).
        """
        check_cache_path(self.target)
        kept, kept_bytes, kept_datasets = self._kept_groups(key)
        arrays = [np.asarray(a, np.float32) for a in features] + ([] if probe is None else [probe])
        data = kept_bytes + sum(a.nbytes for a in arrays)
        size = USER_BLOCK + (1 << 20) + data + data // 16 + DATASET_OVERHEAD * (kept_datasets + len(arrays) + 8)
        try:
            os.makedirs(os.path.dirname(self.target), exist_ok=True)
            with atomic_path(self.target) as tmp:
                _create_cache_file(tmp, size)
                with h5py.File(tmp, "r+") as f:
                    if kept:
                        with h5py.File(self.target, "r") as old:
                            check_self_contained(old, self.path, FeatureCacheReferenceError)  # as _kept_groups saw it
                            for name in kept:
                                old.copy(old[name], f, name)
                    group = f.create_group(key)
                    for i, array in enumerate(arrays[: len(features)]):
                        group.create_dataset(str(i), data=array)
                    if probe is not None:
                        group.create_dataset("probe", data=np.asarray(probe, np.float32))
                    if precision is not None:
                        group.attrs["precision"] = precision
                    group.attrs["digest"] = digest
        except OSError as e:
            reason = f"{e.strerror} (errno {errno.errorcode.get(e.errno, e.errno)})" if e.strerror else one_line(e)
            kept_text = "the previous cache is kept" if os.path.exists(self.target) else "no cache written"
            raise FeatureCacheError(f"cannot write the feature cache {self.path!r}: {reason}; {kept_text}") from None


def _same_probe(group, probe):
    if "probe" not in group:
        return False
    stored = group["probe"][...]
    return stored.shape == probe.shape and bool(np.allclose(stored, probe, rtol=0, atol=PROBE_ATOL))


def cache_digest(identity, tokens):
    """The digest a cached entry is stored under: the feature layout, the source's `identity`, the sentences."""
    return hashlib.sha256(json.dumps([FEATURES_LAYOUT, identity, tokens], sort_keys=True).encode()).hexdigest()


def cached_features(source, sentences, cache_path=None, key="features", progress=None, identity=None):
    """Per-sentence activations from `source`, stored in / read from an hdf5 cache when `cache_path` is set.

    A cached entry is used only when it was made for the same sentences (tokens) and the same `identity` (default:
    `source.identity`, the content of the biLM, not its paths) and, for a served source, gives the same features for
    `PROBE_TOKENS`; otherwise it is recomputed and replaced. A damaged cache of ours is rebuilt (with a log line).
    `progress(n)`, when given, is called as sentences are computed.

    Raises:
        FeatureCacheError: `cache_path` holds a file that is not a cache of ours (checked before any work), or the
            cache cannot be written (a full disk; the previous cache is kept).
        SentenceTooLongError: from the source, with `.line` set from the sentence.
    """
    tokens = [s.tokens for s in sentences]
    cache = FeatureCache(cache_path) if cache_path else None
    if cache is not None:
        identity = getattr(source, "identity", None) if identity is None else identity
        if identity is None:
            raise ValueError("cached_features: the source has no `identity` and none was given; a cache needs one")
        digest, probe = cache_digest(identity, tokens), getattr(source, "probe_features", None)
        cached = cache.read(key, digest, len(sentences), probe)
        if cached is not None:
            if progress:
                progress(len(sentences))
            return cached
    try:
        features = source(tokens, progress=progress)
    except SentenceTooLongError as e:
        e.line = getattr(sentences[e.index], "line", None)
        raise
    if cache is not None:
        cache.write(key, digest, features, probe, precision=getattr(source, "precision", None))
    return features
