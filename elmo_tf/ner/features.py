"""ELMo features for the NER head: from a biLM in this process or from a model server, cached in hdf5.

Both sources give, per sentence, the biLM activations `(L+1, n_tokens, 2P)` with the token layer duplicated,
exactly the layout of `python -m elmo_tf embed --layers all`.
"""

import hashlib
import json
import logging
import os

import numpy as np

from elmo_tf.cli import one_line
from elmo_tf.serving_contract import activations_from_outputs

logger = logging.getLogger(__name__)


class FeatureSourceError(ValueError):
    """A feature source that cannot be opened; the message says which and why, in one line."""


def _in_batches(fetch, sentences, batch_size, progress=None):
    """Per-sentence arrays of `fetch` called on chunks of `batch_size`; `progress(n)` after each chunk."""
    out = []
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start : start + batch_size]
        out.extend(fetch(chunk))
        if progress:
            progress(len(chunk))
    return out


class InProcessFeatures:
    """biLM activations from an `ELMo` model run in this process."""

    def __init__(self, elmo, batch_size=32):
        from elmo_tf.embed import Embedder

        self.embedder = Embedder(elmo, layers="all")
        self.batch_size = batch_size
        self.dim = 2 * elmo.config.projection_dim
        self.num_layers = elmo.num_output_layers

    def __call__(self, sentences, progress=None):
        def fetch(chunk):
            return self.embedder.embed_batch([[t.encode("utf-8", "surrogateescape") for t in s] for s in chunk])

        return _in_batches(fetch, sentences, self.batch_size, progress)


class ServedFeatures:
    """biLM activations from a model server's `tokens` signature (TF Serving or `serving/serve.py`).

    Args:
        client: an object with `embed_tokens(tokens, sequence_len=...)` returning the signature's outputs (e.g.
            `serving.client.ElmoClient`).
    """

    def __init__(self, client, batch_size=32):
        self.client = client
        self.batch_size = batch_size
        probe = self._fetch([["probe"]])[0]
        self.num_layers, _, self.dim = probe.shape

    def _fetch(self, sentences):
        width = max(1, max(len(s) for s in sentences))
        tokens = np.array([list(s) + [""] * (width - len(s)) for s in sentences], dtype=object)
        lengths = np.array([len(s) for s in sentences], np.int32)
        stacked = activations_from_outputs(self.client.embed_tokens(tokens, sequence_len=lengths))
        return [stacked[i, :, :n] for i, n in enumerate(lengths)]

    def __call__(self, sentences, progress=None):
        return _in_batches(self._fetch, sentences, self.batch_size, progress)


def elmo_paths(path):
    """(options.json, weights.hdf5) of an `--elmo` argument: a directory holding both, or a .hdf5 file with
    options.json beside it."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    weights = path if path.endswith(".hdf5") else os.path.join(folder, "weights.hdf5")
    return os.path.join(folder, "options.json"), weights


def open_feature_source(elmo=None, elmo_server=None, model_name="elmo", options=None, weights=None, batch_size=32):
    """An `InProcessFeatures` (`elmo` path, or `options` + `weights`) or `ServedFeatures` (`elmo_server` HOST:PORT),
    and a description of it (recorded in a tagger's config.json so tagging finds the same source).

    Raises:
        FeatureSourceError: with a one-line reason.
    """
    if elmo_server:
        from elmo_tf.serving.client import ElmoClient

        try:
            source = ServedFeatures(ElmoClient(elmo_server, model_name=model_name), batch_size=batch_size)
        except Exception as e:  # the client's ServingError carries the gRPC status
            raise FeatureSourceError(
                f"cannot get features from {elmo_server!r} (model {model_name!r}): {one_line(e)}"
            ) from None
        return source, {"kind": "server", "address": elmo_server, "model_name": model_name}
    if elmo:
        options, weights = elmo_paths(elmo)
    for what, path in (("options", options), ("weights", weights)):
        if not path or not os.path.isfile(path):
            raise FeatureSourceError(f"no {what} file at {path!r}")
    from elmo_tf.io import load_elmo

    try:
        source = InProcessFeatures(load_elmo(options, weights), batch_size=batch_size)
    except (ValueError, OSError, KeyError) as e:
        raise FeatureSourceError(f"cannot load the biLM from {options!r} and {weights!r}: {e}") from None
    return source, {"kind": "in_process", "options": os.path.abspath(options), "weights": os.path.abspath(weights)}


# ------------------------------------------------------------------------------------------------ cache


def _read_cached(cache_path, key, digest, count):
    """The cached arrays of `key`, or None when absent, made for other inputs, incomplete or damaged (logged)."""
    import h5py

    if not os.path.exists(cache_path):
        return None
    try:
        with h5py.File(cache_path, "r") as f:
            if key not in f:
                return None
            group = f[key]
            if group.attrs.get("digest") != digest:
                why = "was interrupted" if "digest" not in group.attrs else "was made for other inputs"
                logger.info("feature cache %s: %r %s; recomputing it", cache_path, key, why)
                return None
            return [group[str(i)][...] for i in range(count)]
    except (OSError, KeyError, ValueError) as e:
        logger.warning("feature cache %s is damaged (%s: %s); rebuilding it", cache_path, type(e).__name__, e)
        return None


def _write_cached(cache_path, key, digest, features):
    """Writes `key`'s arrays, data first and the digest last, so an interrupted write is never taken as complete."""
    import h5py

    try:
        f = h5py.File(cache_path, "a")
    except OSError as e:  # not an hdf5 file any more (a write killed mid-way): start the file again
        logger.warning("feature cache %s cannot be opened (%s); replacing it", cache_path, e)
        os.remove(cache_path)
        f = h5py.File(cache_path, "w")
    with f:
        if key in f:
            del f[key]
        group = f.create_group(key)
        for i, array in enumerate(features):
            group.create_dataset(str(i), data=array)
        f.flush()
        group.attrs["digest"] = digest


def cached_features(source, sentences, cache_path=None, key="features", source_info="", progress=None):
    """Per-sentence activations from `source`, stored in / read from an hdf5 cache when `cache_path` is set.

    A cached entry is used only when it was made for the same sentences (tokens) and the same `source_info` (a
    description of the feature source) and was written to the end; otherwise it is recomputed and replaced. A
    damaged cache file is rebuilt (with a log line). `progress(n)`, when given, is called as sentences are computed.
    """
    tokens = [s.tokens for s in sentences]
    digest = hashlib.sha256(json.dumps([source_info, tokens]).encode()).hexdigest()
    if cache_path:
        cached = _read_cached(cache_path, key, digest, len(sentences))
        if cached is not None:
            if progress:
                progress(len(sentences))
            return cached
    features = source(tokens, progress=progress)
    if cache_path:
        _write_cached(cache_path, key, digest, features)
    return features
