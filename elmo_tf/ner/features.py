"""ELMo features for the NER head: from a biLM in this process or from a model server.

Both sources give, per sentence, the biLM activations `(L+1, n_tokens, 2P)` with the token layer duplicated,
exactly the layout of `python -m elmo_tf embed --layers all`. Each names what its features depend on in `identity`
(JSON): a biLM in this process the sha256 of its options and weight values (`model_fingerprint`: the content,
wherever the files are and whatever their times) and, unless float32, the precision it computes in
(`elmo_tf.precision`), a server the version that answered, plus `probe_features`, a fixed sentence's activations that
a cache compares with a tolerance.

Served requests fit the server's request budget (`RequestLimits`): sentences are packed longest first, each request
within the rows limit and rows x its longest sentence (the padded width) within the tokens limit. A limit the
embedded server (serving/serve.py) refuses a request for is read from its RESOURCE_EXHAUSTED message, which names
the limit's value and flag (`--max_request_sentences`, `--max_request_tokens`, `--max_tokens_per_sentence`), and
the sentences are packed again under it; any other RESOURCE_EXHAUSTED (a message size, TF Serving's or gRPC's own)
halves the tokens per request. A sentence the server refuses alone raises `SentenceTooLongError` naming it.

The features are cached by `elmo_tf.ner.feature_cache`.
"""

import dataclasses
import functools
import logging
import os
import re
import time

import numpy as np
import tensorflow as tf

from elmo_tf.embed import Embedder
from elmo_tf.embed.embedder import model_precision
from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.models import load_elmo
from elmo_tf.models.elmo import model_fingerprint
from elmo_tf.saved_model.contract import activations_from_outputs, layer_keys

logger = logging.getLogger(__name__)

DEFAULT_REQUEST_TOKENS = 16384  # rows x padded width of one served request: the embedded server's default
PROBE_TOKENS = ["The", "probe", "sentence", ",", "Zürich", "1996", "!"]  # a served biLM's features are compared on it


class FeatureSourceError(ElmoTFError):
    """A feature source that cannot be opened or used; the message says which and why, in one line."""


class SentenceTooLongError(FeatureSourceError):
    """A sentence no request can carry: over the server's limit of tokens per sentence or per request.

    Attributes:
        index: the sentence's position in the list given to the source.
        line: its 1-based line in its file, when known (`cached_features` sets it from the `Sentence`).
        split: the split it belongs to, when known (`elmo_tf.ner.training.add_features` sets it).
    """

    def __init__(self, index, message):
        super().__init__(message)
        self.index, self.line, self.split = index, None, None


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
    """biLM activations from an `ELMo` model run in this process: on the host through an `elmo_tf.embed.Embedder`
    (packed rows, distinct tokens encoded once), and inside a graph by calling the model (`graph_activations`, what the
    tagger export runs).

    Attributes:
        elmo: the `ELMo` model. num_layers, dim: its L+1 and 2P. precision: what it computes in ("float32" or
            "bfloat16", `elmo_tf.precision`).
    """

    def __init__(self, elmo, batch_size=32):
        self.elmo = elmo
        self.batch_size = batch_size
        self.dim = 2 * elmo.config.projection_dim
        self.num_layers = elmo.num_output_layers
        self.precision = model_precision(elmo)

    @functools.cached_property
    def embedder(self):
        """The `Embedder` of the host side, made on first use (a graph built for export never needs it)."""
        return Embedder(self.elmo, layers="all")

    @functools.cached_property
    def identity(self):
        """{"kind": "in_process", "sha256": `model_fingerprint`}, and "precision" unless float32 (the identity of a
        float32 biLM is what it was before precisions, so its caches stay valid): computed once, on first use."""
        identity = {"kind": "in_process", "sha256": model_fingerprint(self.elmo)}
        if self.precision != "float32":
            identity["precision"] = self.precision
        return identity

    def __call__(self, sentences, progress=None):
        def fetch(chunk):
            return self.embedder.embed_batch([[t.encode("utf-8", "surrogateescape") for t in s] for s in chunk])

        return _in_batches(fetch, sentences, self.batch_size, progress)

    def graph_activations(self, tokens):
        """The activations as a tensor `(batch, L+1, T, 2P)`, in a graph or eagerly: the model called on tf.string
        tokens `(batch, T)` ("" padding) mapped by its own char mapping (`ELMo.tokens_to_char_ids`: bilm-tf's bytes
        or a converted model's char vocabulary), as the host side's `Embedder` maps them."""
        char_ids = self.elmo.tokens_to_char_ids(tokens)
        return tf.stack(self.elmo(char_ids, training=False)["activations"], axis=1)


# ------------------------------------------------------------------------------------------------ served


@dataclasses.dataclass
class RequestLimits:
    """The budget each request to the server must fit.

    Attributes:
        max_sentences: rows per request.
        max_tokens: rows x the request's longest sentence (its padded width); None for no limit.
        max_sentence_tokens: tokens of one sentence; None for no limit.
        known: limit name -> where it comes from ("the server's ..."), for the limits the server stated or the
            caller gave; a sentence over one of them is refused before anything is sent. The others are guesses,
            lowered when the server refuses a request.
    """

    max_sentences: int = 32
    max_tokens: int = DEFAULT_REQUEST_TOKENS
    max_sentence_tokens: int = None
    known: dict = dataclasses.field(default_factory=dict)


# the embedded server's RESOURCE_EXHAUSTED messages name the limit's value and flag (serving/servable.py)
_STATED_LIMIT = re.compile(
    r"limit of (\d+) (?:tokens )?per (?:request|sentence) "
    r"\(--(max_request_sentences|max_request_tokens|max_tokens_per_sentence)\)"
)
_LIMIT_OF_FLAG = {
    "max_request_sentences": "max_sentences",
    "max_request_tokens": "max_tokens",
    "max_tokens_per_sentence": "max_sentence_tokens",
}
_BUSY = re.compile(r"requests in flight")  # the embedded server's in-flight cap: retried, not split
BUSY_RETRIES = 6


def pack_requests(lengths, max_sentences, max_tokens=None):
    """Requests (lists of indices into `lengths`, the sentences' token counts), longest sentences first: each holds
    at most `max_sentences` rows and rows x max(1, its longest sentence) <= `max_tokens` tokens (a sentence longer
    than that goes alone)."""
    requests, width = [], 1
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        last = requests[-1] if requests else None
        if last and len(last) < max_sentences and (max_tokens is None or (len(last) + 1) * width <= max_tokens):
            last.append(i)
        else:
            requests.append([i])
            width = max(1, lengths[i])
    return requests


def _resource_exhausted(error):
    """True for a client error carrying the gRPC status RESOURCE_EXHAUSTED (`elmo_tf.serving.client.ServingError`)."""
    return getattr(getattr(error, "code", None), "name", None) == "RESOURCE_EXHAUSTED"


class ServedFeatures:
    """biLM activations from a model server's `tokens` signature (TF Serving or `serving/serve.py`), in requests
    packed to fit the server's budget (see the module docstring).

    Args:
        client: an object with `embed_tokens(tokens, sequence_len=..., output_filter=...)` returning the
            signature's outputs (e.g. `elmo_tf.serving.client.ElmoClient`); RESOURCE_EXHAUSTED errors carry `.code` and
            `.details`.
        batch_size: most sentences per request (lowered to the server's limit when it states one).
        max_request_tokens: most rows x padded width per request, a limit the caller knows the server has (a
            sentence longer is refused before it is sent); None: `DEFAULT_REQUEST_TOKENS` as a first guess.
    """

    def __init__(self, client, batch_size=32, max_request_tokens=None):
        for name, value in (("batch_size", batch_size), ("max_request_tokens", max_request_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.client = client
        self.limits = RequestLimits(max_sentences=batch_size, max_tokens=max_request_tokens or DEFAULT_REQUEST_TOKENS)
        if max_request_tokens:
            self.limits.known["max_tokens"] = "the limit this source was given"
        self.requests = 0  # requests that returned features
        outputs = client.embed_tokens([PROBE_TOKENS], sequence_len=np.array([len(PROBE_TOKENS)], np.int32))
        self.output_filter = layer_keys(outputs)  # the activations only (no mix, default, mask)
        self.probe_features = activations_from_outputs(outputs)[0]
        self.num_layers, _, self.dim = self.probe_features.shape
        self.identity = {"kind": "server", "model_version": int(getattr(outputs, "model_version", 0) or 0)}

    def _fetch(self, sentences):
        width = max(1, max(len(s) for s in sentences))
        tokens = np.empty([len(sentences), width], dtype=object)
        for row, sentence in enumerate(sentences):
            tokens[row] = list(sentence) + [""] * (width - len(sentence))
        lengths = np.array([len(s) for s in sentences], np.int32)
        outputs = self.client.embed_tokens(tokens, sequence_len=lengths, output_filter=self.output_filter)
        stacked = activations_from_outputs(outputs)
        self.requests += 1
        return [stacked[i, :, :n] for i, n in enumerate(lengths)]

    def _refuse_unsendable(self, lengths, indices):
        """Raises `SentenceTooLongError` for the first of `indices` (in input order) over a known limit."""
        limits = self.limits
        for field, unit in (("max_sentence_tokens", "per sentence"), ("max_tokens", "per request")):
            limit = getattr(limits, field)
            if field in limits.known and limit is not None:
                for i in sorted(indices):
                    if lengths[i] > limit:
                        raise SentenceTooLongError(
                            i,
                            f"a sentence of {lengths[i]} tokens, above {limits.known[field]}: {limit} tokens "
                            f"{unit}; split the sentence or raise the limit",
                        )

    def _learn(self, details):
        """Takes a limit stated in a RESOURCE_EXHAUSTED message; True when it is news (a lower value)."""
        match = _STATED_LIMIT.search(details)
        if not match:
            return False
        value, flag = int(match[1]), match[2]
        field = _LIMIT_OF_FLAG[flag]
        current = getattr(self.limits, field)
        self.limits.known[field] = f"the server's limit (--{flag})"
        if current is not None and current <= value:
            return False  # refused although within it: not a limit we can pack under
        setattr(self.limits, field, value)
        logger.info("the server allows %d %s (--%s): packing requests under it", value, field, flag)
        return True

    def _repack(self, lengths, indices):
        """`pack_requests` of the sentences `indices` under the current limits (as lists of those indices)."""
        packed = pack_requests([lengths[i] for i in indices], self.limits.max_sentences, self.limits.max_tokens)
        return [[indices[k] for k in request] for request in packed]

    def __call__(self, sentences, progress=None):
        """Per-sentence activations of `sentences` (token lists), in their order; `progress(n)` after each request.

        Raises:
            SentenceTooLongError: a sentence over a limit the server states or refuses it for alone.
            The client's error for any other failure.
        """
        lengths = [len(s) for s in sentences]
        everything = range(len(sentences))
        self._refuse_unsendable(lengths, everything)
        out = [None] * len(sentences)
        pending = self._repack(lengths, list(everything))
        busy = 0
        while pending:
            rows = pending.pop(0)
            try:
                arrays = self._fetch([sentences[i] for i in rows])
            except Exception as e:
                if not _resource_exhausted(e):
                    raise
                details = one_line(getattr(e, "details", None) or e)
                if _BUSY.search(details):  # the server is busy, not the request too big
                    if busy >= BUSY_RETRIES:
                        raise
                    time.sleep(0.05 * 2**busy)
                    busy += 1
                    pending.insert(0, rows)
                    continue
                if self._learn(details):
                    self._refuse_unsendable(lengths, everything)
                elif len(rows) > 1:  # a limit not stated (message size, ...): half the tokens per request
                    width = max(1, max(lengths[i] for i in rows))
                    self.limits.max_tokens = max(1, len(rows) // 2) * width
                    logger.info(
                        "the server refused %d x %d tokens; at most %d per request now",
                        len(rows),
                        width,
                        self.limits.max_tokens,
                    )
                else:
                    raise SentenceTooLongError(
                        rows[0], f"a sentence of {lengths[rows[0]]} tokens, refused by the server: {details}"
                    ) from None
                pending = self._repack(lengths, rows + [i for request in pending for i in request])
                continue
            busy = 0
            for i, array in zip(rows, arrays):
                out[i] = array
            if progress:
                progress(len(rows))
        return out


# ------------------------------------------------------------------------------------------------ opening


def elmo_paths(path):
    """(options.json, weights.hdf5) of an `--elmo` argument: a directory holding both, or a .hdf5 file with
    options.json beside it."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    weights = path if path.endswith(".hdf5") else os.path.join(folder, "weights.hdf5")
    return os.path.join(folder, "options.json"), weights


def open_feature_source(
    elmo=None,
    elmo_server=None,
    model_name="elmo",
    options=None,
    weights=None,
    batch_size=32,
    max_request_tokens=None,
    credentials=None,
    precision=None,
):
    """An `InProcessFeatures` (`elmo` path, or `options` + `weights`; `precision`: what its biLM computes in, one of
    `elmo_tf.precision.PRECISIONS`, None: float32) or `ServedFeatures` (`elmo_server` HOST:PORT, `max_request_tokens`:
    see there; `credentials`: the client's `grpc.ChannelCredentials` for a server on TLS), and a description of it
    (recorded in a tagger's config.json so tagging finds the same source; for a biLM in this process with the
    precision it computed in).

    Raises:
        FeatureSourceError: with a one-line reason (a `precision` for a server's features among them: a server
            computes in its export's precision).
    """
    if elmo_server and precision not in (None, "float32"):
        raise FeatureSourceError(
            f"precision {precision!r} applies to a biLM in this process; {elmo_server!r} computes in the precision of "
            "its export (elmo-tf export --precision)"
        )
    if elmo_server:
        # deferred, and only here: the client needs gRPC and tensorflow-serving-api, the optional `serving` extra
        # (pyproject.toml); a biLM in this process works without it
        from elmo_tf.serving.client import ElmoClient

        try:
            source = ServedFeatures(
                ElmoClient(elmo_server, model_name=model_name, credentials=credentials),
                batch_size=batch_size,
                max_request_tokens=max_request_tokens,
            )
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
    try:
        source = InProcessFeatures(load_elmo(options, weights, precision=precision or "float32"), batch_size=batch_size)
    except (ValueError, OSError, KeyError) as e:
        raise FeatureSourceError(f"cannot load the biLM from {options!r} and {weights!r}: {e}") from None
    where = {"options": os.path.abspath(options), "weights": os.path.abspath(weights)}
    return source, {"kind": "in_process", **where, "precision": source.precision}


def changed_source(recorded, source):
    """Why `source` is not the feature source `recorded` (a tagger's config.json `elmo_source`, with the `identity`
    training saw) describes, in one line; None when it is the same or the record does not say."""
    before, now = (recorded or {}).get("identity") or {}, getattr(source, "identity", None) or {}
    if before.get("kind") != now.get("kind"):
        return None
    if now.get("kind") == "in_process" and before.get("sha256") != now.get("sha256"):
        return (
            f"the biLM's options or weights changed since the tagger was trained (sha256 {before.get('sha256')} "
            f"then, {now.get('sha256')} now)"
        )
    if now.get("kind") == "server" and before.get("model_version") != now.get("model_version"):
        return (
            f"the server answers with model version {now.get('model_version')}, training used version "
            f"{before.get('model_version')}"
        )
    return None


def changed_precision(recorded, source):
    """Why the features of `source` (a biLM in this process) are not computed in the precision training's were
    (`recorded`: a tagger's config.json `elmo_source`; a record without one: float32), in one line; None when they
    are, or for a served source."""
    now = getattr(source, "precision", None)
    if now is None or (recorded or {}).get("kind") not in (None, "in_process"):
        return None
    before = (recorded or {}).get("precision") or "float32"
    if before == now:
        return None
    return f"the features are computed in {now}, the tagger was trained on features computed in {before}"
