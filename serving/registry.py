"""The servable registry: models by name, their versions on disk, loading and retiring them, and the calls both
fronts make (`predict`, `model_status`, `model_metadata`, `stats`). `serving.grpc_front` and `serving.rest` are thin
layers over a `ModelRegistry`; `serving.server.ModelServer` is a registry that also runs them.

Version directories, as TF Serving's file-system source reads them
(`tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc`):
    - a child of the base path is a version when its name parses to an int64 (`ParseVersionNumber`, i.e.
      `strings::safe_strto64`): "007" is version 7; a number above 2**63 - 1 ("99999999999999999999") is not a
      version and is ignored. Stricter than `safe_strto64`: only ASCII digits count (it also takes a sign and
      surrounding spaces: "-1", " 7"); other names are ignored, each logged once while it stays on disk;
    - two names for one number ("7" and "007"): as `IndexChildrenByVersion`, the name that sorts last wins ("7",
      i.e. the fewest leading zeros), with one warning;
    - the "latest" version policy (the default): the highest version is served. Unlike TF Serving, a version counts
      only once it holds `saved_model.pb` (or `.pbtxt`), so a directory being written is not a failed load, and
      while the highest version fails, the highest lower one that loads is served;
    - a load that fails is retried `max_num_load_retries` times, `load_retry_interval_micros` apart (TF Serving's
      flags and defaults: 5 retries, one minute), on later polls; meanwhile and afterwards the version already
      served stays served. After the last retry the version is END with its error; it is tried again (a new round
      of retries) once its files change, so a model copied in slowly loads when the copy is complete;
    - versions that are gone from disk lose their state (GetModelStatus no longer lists them); the served version
      is kept until another loads, and no version is unloaded when the base path is empty (a transient listing).

GetModelStatus: LOADING -> AVAILABLE for a new version, UNLOADING -> END for the one it replaces (unloaded when its
last request ends); START with the error while a failed load waits for its retry, END with the error after the
last. Messages to clients never hold the server's paths (`redact_paths`); the log has them.

Requests: `predict` runs at most `max_requests_in_flight` requests at once over both fronts; past that a request is
answered RESOURCE_EXHAUSTED at once. A deadline that has passed is answered DEADLINE_EXCEEDED without running
the model; the batch scheduler drops requests whose deadline passes while they are queued.
"""

import collections
import contextlib
import dataclasses
import logging
import os
import re
import threading
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from elmo_tf.export import parse_version
from serving.batching import BatchingOptions, BatchScheduler, BatchStats
from serving.servable import Limits, MiB, check_response_size, load_servable
from serving.status import SIGNATURE_DEF_FIELD, ServingError, not_found, resource_exhausted, status_code

logger = logging.getLogger("serving.registry")

State = get_model_status_pb2.ModelVersionStatus.State
NO_DEADLINE = 1e6  # seconds; longer timeouts (gRPC's "no deadline" is ~9.2e18 s) mean none
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_ABSOLUTE_PATH = re.compile(r"(?<![\w>)\]])(?:[A-Za-z]:)?[/\\][^\s'\"]*")


@dataclasses.dataclass
class ServerOptions:
    """Settings of the embedded server (the CLI flags of `serving/serve.py`, TF Serving's names where it has one).

    Args:
        host: interface to bind, "127.0.0.1" (local only) by default; "0.0.0.0" for all.
        port: gRPC port; 0 picks a free one (see `ModelServer.grpc_port`).
        rest_api_port: REST port; None for no REST server, 0 picks a free one.
        enable_batching: merge concurrent requests (`serving.batching`).
        batching: `BatchingOptions` (max_batch_size, batch_timeout, num_threads).
        max_request_sentences, max_tokens_per_sentence, max_request_tokens: the request budget
            (`serving.servable.Limits`; None for no limit of tokens).
        max_message_bytes: gRPC max send/receive message size, the request's bytes in and its response's bytes out
            (`Limits.max_request_bytes`, `Limits.max_response_bytes`), and a bound of the REST body.
        max_requests_in_flight: Predict requests running or queued at once, over gRPC and REST together.
        rest_api_max_body_bytes, rest_api_max_bytes_in_flight: REST body limit, and bytes of bodies and responses
            the REST front holds at once (None: `serving.rest`'s defaults, 8 MiB and 64 MiB).
        file_system_poll_wait_seconds: how often base paths are polled for new versions.
        max_num_load_retries: retries of a version that failed to load (0: one attempt).
        load_retry_interval_micros: time between those retries.
        grpc_max_threads: gRPC handler threads.
        rest_api_num_threads: REST worker threads.
        rest_api_timeout_in_ms: REST request deadline.
    """

    host: str = "127.0.0.1"
    port: int = 8500
    rest_api_port: int = None
    enable_batching: bool = True
    batching: BatchingOptions = dataclasses.field(default_factory=BatchingOptions)
    max_request_sentences: int = Limits.max_request_sentences
    max_tokens_per_sentence: int = Limits.max_tokens_per_sentence
    max_request_tokens: int = Limits.max_request_tokens
    max_message_bytes: int = 256 * MiB
    max_requests_in_flight: int = 64
    file_system_poll_wait_seconds: float = 1.0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60 * 1000 * 1000
    grpc_max_threads: int = 64
    rest_api_num_threads: int = 32
    rest_api_timeout_in_ms: int = 30000
    rest_api_max_body_bytes: int = None
    rest_api_max_bytes_in_flight: int = None

    def __post_init__(self):
        if not isinstance(self.max_message_bytes, int) or not 1 <= self.max_message_bytes < 2**31:
            raise ValueError(
                f"max_message_bytes must be in [1, 2**31 - 1] (a gRPC limit), got {self.max_message_bytes!r}"
            )
        if not self.file_system_poll_wait_seconds > 0:
            raise ValueError(f"file_system_poll_wait_seconds must be > 0, got {self.file_system_poll_wait_seconds!r}")
        for name, low in (
            ("max_requests_in_flight", 1),
            ("max_num_load_retries", 0),
            ("load_retry_interval_micros", 0),
            ("grpc_max_threads", 1),
            ("rest_api_num_threads", 1),
            ("rest_api_timeout_in_ms", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for name in ("rest_api_max_body_bytes", "rest_api_max_bytes_in_flight"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        _ = self.limits  # validates the request limits

    @property
    def limits(self):
        return Limits(
            max_request_sentences=self.max_request_sentences,
            max_tokens_per_sentence=self.max_tokens_per_sentence,
            max_response_bytes=self.max_message_bytes,
            max_request_tokens=self.max_request_tokens,
            max_request_bytes=self.max_message_bytes,
        )


# ---------------------------------------------------------------------------------------------------- versions


def versions_on_disk(base_path):
    """`({version: directory name}, {ignored name: why})` for the children of `base_path`: the versions that hold a
    SavedModel, and the names that are not read as versions (hidden names, such as an export's temporaries, are
    left out of both)."""
    try:
        names = sorted(os.listdir(base_path))
    except OSError:
        return {}, {}
    versions, ignored = {}, {}
    for name in names:  # sorted: of two names for one number, the last wins, as in TF Serving
        version = parse_version(name)
        if version is None:
            if not name.startswith("."):
                digits = name.isascii() and name.isdigit()
                ignored[name] = "a number above 2**63 - 1" if digits else "not a version number"
        elif any(os.path.isfile(os.path.join(base_path, name, f)) for f in SAVED_MODEL_FILES):
            if version in versions:
                ignored[versions[version]] = f"version {version} is read from {name!r}"
            versions[version] = name
    return versions, ignored


def files_fingerprint(path, limit=10000):
    """A hash of the names, sizes and modification times of the files under `path` (at most `limit` of them)."""
    entries = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            entries.append((os.path.relpath(os.path.join(root, name), path), st.st_size, st.st_mtime_ns))
            if len(entries) >= limit:
                return hash(tuple(entries))
    return hash(tuple(entries))


def redact_paths(message, known=()):
    """`message` without filesystem paths: each of `known` (`{path: replacement}` items) is replaced, then any other
    absolute path becomes "<path>"."""
    for path, replacement in known:
        message = message.replace(path, replacement)
    return _ABSOLUTE_PATH.sub("<path>", message)


def _servable_request(name, version):
    return f"Specific({name}, {version})" if version is not None else f"Latest({name})"


@dataclasses.dataclass
class _Failures:
    """Failed loads of one version: how many, when the next may start (monotonic), the files they saw."""

    count: int
    next_try: float
    fingerprint: int


class ModelManager:
    """Serves the highest loadable version under one model's base path; loads new versions and retires old ones.

    Args:
        name: the model name clients ask for.
        base_path: the directory holding `<version>/saved_model.pb`.
        options: `ServerOptions`.
        stats: `BatchStats`.
    """

    def __init__(self, name, base_path, options, stats):
        self.name = name
        self.base_path = os.path.abspath(base_path)
        self.options = options
        self.stats = stats
        self._lock = threading.Lock()
        self._current = None
        self._refs = collections.Counter()
        self._retiring = set()
        self._states = {}  # version -> (State, grpc.StatusCode, message)
        self._failures = {}  # version -> _Failures
        self._logged_names = set()
        self._warned_empty = False
        self._stop = threading.Event()
        self._poller = None
        self._known_paths = sorted(
            {(p, f"<base path of {name}>") for p in (base_path, self.base_path, os.path.realpath(base_path))},
            key=lambda item: -len(item[0]),
        )

    def redact(self, message):
        return redact_paths(message, self._known_paths)

    # ------------------------------------------------------------------------------------------------ versions

    def poll(self):
        """One look at the base path: forgets versions gone from disk, then serves the highest one that loads."""
        versions, ignored = versions_on_disk(self.base_path)
        self._log_ignored(ignored)
        self._forget_missing(versions)
        if not versions:
            if not self._warned_empty:
                logger.warning("No versions of servable %s found under base path %s", self.name, self.base_path)
                self._warned_empty = True
            return
        self._warned_empty = False
        for version in sorted(versions, reverse=True):
            current = self._current
            if current is not None and current.version == version:
                return
            path = os.path.join(self.base_path, versions[version])
            if self._may_load(version, path) and self._load(version, path):
                return

    def _log_ignored(self, ignored):
        for name in sorted(set(ignored) - self._logged_names):
            logger.warning("ignoring %r under the base path of %s: %s", name, self.name, ignored[name])
        self._logged_names = set(ignored)

    def _forget_missing(self, versions):
        with self._lock:
            keep = {s.version for s in [self._current, *self._retiring] if s is not None} | set(versions)
            for version in [v for v in self._states if v not in keep]:
                del self._states[version]
        for version in [v for v in self._failures if v not in versions]:
            del self._failures[version]

    def _may_load(self, version, path):
        failures = self._failures.get(version)
        if failures is None:
            return True
        if failures.count > self.options.max_num_load_retries:
            if files_fingerprint(path) == failures.fingerprint:
                return False
            logger.info("%s version %d: its files changed since the last failed load; trying again", self.name, version)
            del self._failures[version]
            return True
        return time.monotonic() >= failures.next_try

    def _set_state(self, version, state, code=grpc.StatusCode.OK, message=""):
        with self._lock:
            self._states[version] = (state, code, message)

    def _load(self, version, path):
        """Loads and warms up `version`; on success it replaces the served version. Returns whether it loaded."""
        logger.info("loading %s version %d from %s", self.name, version, path)
        self._set_state(version, State.LOADING)
        try:
            servable = load_servable(self.name, version, path, self.options.limits)
        except Exception as e:
            self._load_failed(version, path, e)
            return False
        self._failures.pop(version, None)
        if self.options.enable_batching:
            servable.scheduler = BatchScheduler(self.options.batching, self.stats, self.name, version)
        with self._lock:
            old, self._current = self._current, servable
            self._states[version] = (State.AVAILABLE, grpc.StatusCode.OK, "")
            if old is not None:
                self._states[old.version] = (State.UNLOADING, grpc.StatusCode.OK, "")
                self._retiring.add(old)
                release_now = self._refs[old] == 0
        logger.info(
            "serving %s version %d%s",
            self.name,
            version,
            f" (replacing version {old.version})" if old is not None else "",
        )
        if old is not None and release_now:
            self._release(old)
        return True

    def _load_failed(self, version, path, error):
        previous = self._failures.get(version)
        count = previous.count + 1 if previous else 1
        interval = self.options.load_retry_interval_micros / 1e6
        self._failures[version] = _Failures(count, time.monotonic() + interval, files_fingerprint(path))
        if isinstance(error, tf.errors.OpError):
            code = status_code(error.error_code)
        else:  # tf.saved_model.load raises FileNotFoundError for TensorFlow's NotFound
            code = grpc.StatusCode.NOT_FOUND if isinstance(error, FileNotFoundError) else grpc.StatusCode.UNKNOWN
        message = f"{type(error).__name__}: {error}".split("\n")[0]
        final = count > self.options.max_num_load_retries
        logger.error(
            "loading %s version %d from %s failed (attempt %d%s): %s",
            self.name,
            version,
            path,
            count,
            ", giving up until its files change" if final else f", retrying in {interval:g} s",
            message,
        )
        self._set_state(version, State.END if final else State.START, code, self.redact(message))

    def _release(self, servable):
        def unload():
            if servable.scheduler is not None:
                servable.scheduler.stop()
            with self._lock:
                self._retiring.discard(servable)
                self._refs.pop(servable, None)
                if self._current is not servable and servable.version in self._states:
                    self._states[servable.version] = (State.END, grpc.StatusCode.OK, "")
            servable.loaded = servable.runners = None
            logger.info("unloaded %s version %d", self.name, servable.version)

        threading.Thread(target=unload, name=f"unload-{self.name}-{servable.version}", daemon=True).start()

    def start_polling(self):
        def loop():
            while not self._stop.wait(self.options.file_system_poll_wait_seconds):
                try:
                    self.poll()
                except Exception:  # a poll must never end the loop
                    logger.exception("polling %s failed", self.base_path)

        self._poller = threading.Thread(target=loop, name=f"poll-{self.name}", daemon=True)
        self._poller.start()

    def stop(self, timeout=None):
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout)
        with self._lock:
            servables = [s for s in [self._current, *self._retiring] if s is not None]
        for servable in servables:
            if servable.scheduler is not None:
                servable.scheduler.stop(timeout)

    # ------------------------------------------------------------------------------------------------ requests

    @contextlib.contextmanager
    def acquire(self, version=None):
        """The served version (NOT_FOUND if `version` is given and differs), held until the block ends."""
        with self._lock:
            servable = self._current
            if servable is None or (version is not None and servable.version != version):
                served = f"; serving version {servable.version}" if servable is not None else "; no version loaded yet"
                raise not_found(f"Servable not found for request: {_servable_request(self.name, version)}{served}")
            self._refs[servable] += 1
        try:
            yield servable
        finally:
            with self._lock:
                self._refs[servable] -= 1
                release = servable in self._retiring and self._refs[servable] == 0
            if release:
                self._release(servable)

    @property
    def served_version(self):
        current = self._current
        return current.version if current is not None else None

    def status(self, version=None):
        """A `GetModelStatusResponse`: every version seen (highest first), or just `version`."""
        with self._lock:
            states = dict(self._states)
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {self.name}")
            states = {version: states[version]}
        elif not states:
            raise not_found(f"Could not find any versions of model {self.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for v in sorted(states, reverse=True):
            state, code, message = states[v]
            entry = response.model_version_status.add(version=v, state=state)
            entry.status.error_code = code.value[0]
            entry.status.error_message = message
        return response


# ---------------------------------------------------------------------------------------------------- registry


class ModelRegistry:
    """Models by name (a `ModelManager` each) and the calls of the gRPC and REST fronts.

    Args:
        models: `{model_name: base_path}`.
        options: `ServerOptions`.
    """

    def __init__(self, models, options=None):
        if not models:
            raise ValueError("models must name at least one {model_name: base_path}")
        self.options = options or ServerOptions()
        self.batch_stats = BatchStats()
        self.managers = {
            name: ModelManager(name, path, self.options, self.batch_stats) for name, path in models.items()
        }
        self._lock = threading.Lock()
        self._in_flight_count = 0
        self._counters = collections.Counter()  # requests refused at the in-flight cap or past their deadline

    def poll(self):
        for manager in self.managers.values():
            manager.poll()

    def start_polling(self):
        for manager in self.managers.values():
            manager.start_polling()

    def stop_models(self, timeout=None):
        for manager in self.managers.values():
            manager.stop(timeout)

    def stats(self):
        """Batching counters (`BatchStats.snapshot()`), the served version of each model, the Predict requests in
        flight, and those refused at the in-flight cap (`rejected_in_flight`) or past their deadline
        (`deadline_exceeded`)."""
        with self._lock:
            counters, in_flight = dict(self._counters), self._in_flight_count
        return {
            **self.batch_stats.snapshot(),
            "served_versions": {name: m.served_version for name, m in self.managers.items()},
            "in_flight": in_flight,
            "rejected_in_flight": counters.get("rejected_in_flight", 0),
            "deadline_exceeded": counters.get("deadline_exceeded", 0),
        }

    def _count(self, key):
        with self._lock:
            self._counters[key] += 1

    def manager(self, name, version=None):
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(
                f"Servable not found for request: {_servable_request(name, version)}; "
                f"this server serves {sorted(self.managers)}"
            )
        return manager

    @contextlib.contextmanager
    def _client_errors(self, manager):
        """Counts DEADLINE_EXCEEDED answers; takes the server's paths out of error messages."""
        try:
            yield
        except ServingError as e:
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._count("deadline_exceeded")
            raise ServingError(e.code, manager.redact(e.details), e.http_status) from None

    @contextlib.contextmanager
    def _in_flight(self):
        limit = self.options.max_requests_in_flight
        with self._lock:
            full = self._in_flight_count >= limit
            if full:
                self._counters["rejected_in_flight"] += 1
            else:
                self._in_flight_count += 1
        if full:
            raise resource_exhausted(
                f"the server is already handling {limit} requests, its limit of requests in flight "
                f"(--max_requests_in_flight {limit}): retry later"
            )
        try:
            yield
        finally:
            with self._lock:
                self._in_flight_count -= 1

    def _check_deadline(self, deadline, what):
        if deadline is not None and time.monotonic() >= deadline:
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's deadline passed {what}")

    def predict(
        self,
        name,
        version,
        signature_name,
        decode_inputs,
        output_filter=(),
        timeout=None,
        cancelled=None,
        response_encoding="proto",
    ):
        """Runs one request; returns (version, signature name, outputs alias -> array) in `output_filter` order.

        Args:
            decode_inputs: callable `runner -> {alias: array}` that reads the transport's inputs against the
                signature (TensorProtos for gRPC, JSON for REST), raising `ServingError` on bad input.
            timeout: seconds left before the client's deadline, None for none. A request whose deadline passes
                before the model runs is not run (DEADLINE_EXCEEDED).
            cancelled: optional callable, True when the client went away.
            response_encoding: "proto" or "json", how the response will be written (its size estimate differs).
        Raises:
            ServingError: NOT_FOUND, INVALID_ARGUMENT, RESOURCE_EXHAUSTED (request budget, in-flight cap),
                DEADLINE_EXCEEDED; messages without the server's paths.
        """
        deadline = time.monotonic() + timeout if timeout is not None and timeout < NO_DEADLINE else None
        manager = self.manager(name, version)
        with self._client_errors(manager):
            self._check_deadline(deadline, "before the server started on it")
            with self._in_flight(), manager.acquire(version) as servable:
                runner = servable.runner(signature_name)
                inputs = decode_inputs(runner)
                request = runner.prepare(inputs, output_filter, response_encoding=response_encoding)
                self._check_deadline(deadline, "before the model ran")
                if servable.scheduler is not None:
                    left = deadline - time.monotonic() if deadline is not None else None
                    outputs = servable.scheduler.submit(request, left, cancelled)
                else:
                    outputs = runner.run_batch([request])[0]
                    self.batch_stats.record_call(name, runner.name, 1, request.batch)
                    if isinstance(outputs, ServingError):
                        raise outputs
                outputs = {alias: outputs[alias] for alias in request.output_filter}
                check_response_size(outputs, self.options.max_message_bytes)
                return servable.version, runner.name, outputs

    def model_status(self, name, version=None):
        """A `GetModelStatusResponse` of model `name` (NOT_FOUND for an unknown model or version)."""
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(f"Could not find any versions of model {name}")
        return manager.status(version)

    def model_metadata(self, name, version=None):
        """A `GetModelMetadataResponse` with `metadata["signature_def"]` = the version's `SignatureDefMap`."""
        with self.manager(name, version).acquire(version) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature_def in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(signature_def)
            response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
            return response
