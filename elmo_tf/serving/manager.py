"""The manager of one model's versions: it serves the versions its version policy selects, loads new ones, retries
failed loads and retires versions no longer selected, as TF Serving's AspiredVersionsManager does with the
AvailabilityPreservingPolicy (`Server::BuildAndStart` in server.cc: stock's model server uses no other).

    - the versions come from the model's `source.FileSystemSource`, polled every `file_system_poll_wait_seconds`;
      its version policy (`config_files.VersionPolicy`, latest 1 by default) picks the candidates, highest first;
    - each candidate is loaded, highest first, one after another (the policy's GetNextAction loads the highest new
      aspired version first, availability_preserving_policy.cc `AvailabilityPreservingPolicy::GetNextAction`): under
      `latest { num_versions: N }` the N highest versions that load are served; while one of the N highest fails to
      load, the next lower version that loads is served in its place (stock would serve one fewer); under `all {}` and
      `specific {}` every candidate that loads;
    - a version no longer selected (a higher one loaded under `latest`, gone from disk, ...) is unloaded once a
      selected version is AVAILABLE; while none is, the highest served one stays (availability_preserving_policy.cc
      `GetLowestServableId`: unload only without dropping availability), except when the policy selects no version on
      disk at all (`specific` versions all absent), where, as stock, every version is unloaded;
    - a load includes the warm-up (`servable.Servable.warm_up`: the export's warmup file replayed as TF Serving
      replays it) unless `enable_model_warmup` is off: a warmup file TF Serving refuses, or one of its requests that
      fails, fails the load with that status (DATA_LOSS, INVALID_ARGUMENT, ...) as a broken graph does; a version
      whose files change while it loads (`source.files_fingerprint` before and after) fails that load (UNAVAILABLE)
      and is loaded again, whole;
    - a load that fails is retried `max_num_load_retries` times, `load_retry_interval_micros` apart (TF Serving's
      flags and defaults: 5 retries, one minute), on later polls; meanwhile and afterwards the versions already
      served stay served: a failed load never unloads one. After the last retry the version is END with its error;
      it is tried again (a new round of retries) once its files change (`source.files_fingerprint`), so a model
      copied in slowly loads when the copy is complete;
    - versions that are gone from disk lose their state (GetModelStatus no longer lists them) once unloaded; a served
      version gone from disk is kept until another loads, and no version is unloaded when the base path is empty
      (a transient listing).

Requests: a request for a version is served if that version is AVAILABLE, one without a version by the highest
AVAILABLE one (stock's ServableRequest::Latest, basic_manager.cc `BasicManager::ServingMap::Update`); else NOT_FOUND.
GetModelStatus: LOADING -> AVAILABLE for a new version, UNLOADING -> END for one unloaded (unloaded when its last
request ends: `acquire` holds a version for a request); START with the error while a failed load waits for its
retry, END with the error after the last. Messages to clients never hold the server's paths (`redact`); the log has
them.
"""

import collections
import contextlib
import logging
import os
import threading
import time

import grpc
from tensorflow_serving.apis import get_model_status_pb2

from elmo_tf.serving.batching.scheduler import BatchScheduler
from elmo_tf.serving.load_retries import LoadRetries
from elmo_tf.serving.mixed_precision import apply_mixed_precision
from elmo_tf.serving.servable import load_servable
from elmo_tf.serving.serving_error import ServingError, not_found, redact_paths
from elmo_tf.serving.source import FileSystemSource, files_fingerprint

logger = logging.getLogger(__name__)

State = get_model_status_pb2.ModelVersionStatus.State


def servable_request(name, version):
    return f"Specific({name}, {version})" if version is not None else f"Latest({name})"


class ModelManager:
    """Serves the versions under one model's base path that its version policy selects; loads new versions and
    retires those no longer selected.

    Args:
        name: the model name clients ask for.
        base_path: the directory holding `<version>/saved_model.pb`.
        options: `ServerOptions`.
        stats: `BatchStats`.
        policy: `config_files.VersionPolicy` (None: latest 1).
    """

    def __init__(self, name, base_path, options, stats, policy=None, metrics=None):
        self.name = name
        self.metrics = metrics  # `metrics.ServerMetrics`: loads counted as TF's loader counts them
        self.source = FileSystemSource(name, base_path, policy)
        self.base_path = self.source.base_path
        self.options = options
        self.stats = stats
        self._lock = threading.Lock()
        self._available = {}  # version -> Servable, AVAILABLE
        self._refs = collections.Counter()
        self._retiring = set()
        self._states = {}  # version -> (State, grpc.StatusCode, message)
        self._retries = LoadRetries(name, options)  # failed loads, retried as TF Serving's loader retries them
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
        """One look at the base path: forgets versions gone from disk, loads the candidates of the version policy,
        then unloads the versions no longer selected where that keeps one available."""
        versions = self.source.poll()
        self._forget_missing(versions)
        if not versions:  # an empty listing may be transient: nothing is unloaded
            return
        candidates, count = self.source.candidates(versions)
        keep = self._load_candidates(candidates, count, versions)
        self._retire(keep, selected_any=bool(candidates))

    def _load_candidates(self, candidates, count, versions):
        """The first `count` of `candidates` (highest first) that are AVAILABLE or load now; a candidate that may
        not load yet (a failed load waiting for its retry) or fails is passed over."""
        keep = set()
        for version in candidates:
            if len(keep) == count:
                break
            if version in self._available or (
                self._retries.may_load(version, versions[version]) and self._load(version, versions[version])
            ):
                keep.add(version)
        return keep

    def _retire(self, keep, selected_any):
        """Unloads the AVAILABLE versions not in `keep`, as the AvailabilityPreservingPolicy does
        (availability_preserving_policy.cc `GetLowestServableId`): all of them when a kept version is AVAILABLE or the
        policy selected no version on disk, else all but the highest."""
        retired = sorted(v for v in self._available if v not in keep)
        if not keep and selected_any:
            retired = retired[:-1]
        for version in retired:
            self._unload(version)

    def _forget_missing(self, versions):
        with self._lock:
            keep = {s.version for s in self._retiring} | set(self._available) | set(versions)
            for version in [v for v in self._states if v not in keep]:
                del self._states[version]
        self._retries.forget_missing(versions)

    def _set_state(self, version, state, code=grpc.StatusCode.OK, message=""):
        with self._lock:
            self._states[version] = (state, code, message)

    def _load(self, version, path):
        """Loads and warms up `version`; on success it is AVAILABLE. Returns whether it loaded."""
        logger.info("loading %s version %d from %s", self.name, version, path)
        self._set_state(version, State.LOADING)
        started = time.monotonic()
        try:
            before = files_fingerprint(path)
            apply_mixed_precision(self.options.mixed_precision)  # as stock, before each version loads
            servable = load_servable(
                self.name, version, path, self.options.limits, warmup=self.options.enable_model_warmup
            )
            if files_fingerprint(path) != before:  # parts of it may come from one copy and parts from the next
                servable = None
                raise ServingError(grpc.StatusCode.UNAVAILABLE, f"the files of {path} changed while it loaded")
        except Exception as e:
            if self.metrics is not None:
                self.metrics.record_load(path, False, time.monotonic() - started)
            state, code, message = self._retries.failed(version, path, e)
            self._set_state(version, state, code, self.redact(message))
            return False
        if self.metrics is not None:
            self.metrics.record_load(path, True, time.monotonic() - started)
        self._retries.succeeded(version)
        if self.options.enable_batching:
            servable.scheduler = BatchScheduler(self.options.batching, self.stats, self.name, version)
        with self._lock:
            self._available[version] = servable
            self._states[version] = (State.AVAILABLE, grpc.StatusCode.OK, "")
        logger.info("serving %s version %d", self.name, version)
        return True

    def _unload(self, version):
        """`version` leaves the AVAILABLE versions: UNLOADING, then unloaded once its last request ends."""
        with self._lock:
            servable = self._available.pop(version)
            self._states[version] = (State.UNLOADING, grpc.StatusCode.OK, "")
            self._retiring.add(servable)
            release_now = self._refs[servable] == 0
        logger.info(
            "unloading %s version %d: not selected by its version policy %s", self.name, version, self.source.policy
        )
        if release_now:
            self._release(servable)

    def _release(self, servable):
        def unload():
            if servable.scheduler is not None:
                servable.scheduler.stop()
            with self._lock:
                self._retiring.discard(servable)
                self._refs.pop(servable, None)
                if self._states.get(servable.version, (None,))[0] == State.UNLOADING:  # not loaded again meanwhile
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

    def retire(self, timeout=60.0):
        """Stops polling now and, on a thread of its own, the model threads once no request holds a version (at most
        `timeout` seconds): a model that a new config no longer names finishes what it is answering."""
        self._stop.set()

        def when_idle():
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                with self._lock:
                    if not any(self._refs.values()):
                        break
                time.sleep(0.05)
            self.stop(timeout=5.0)
            logger.info("model %s unloaded (no longer in the config)", self.name)

        threading.Thread(target=when_idle, name=f"retire-{self.name}", daemon=True).start()

    def stop(self, timeout=None):
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout)
        with self._lock:
            servables = [*self._available.values(), *self._retiring]
        for servable in servables:
            if servable.scheduler is not None:
                servable.scheduler.stop(timeout)

    # ------------------------------------------------------------------------------------------------ requests

    @contextlib.contextmanager
    def acquire(self, version=None):
        """The AVAILABLE `version`, or the highest AVAILABLE version when `version` is None, held until the block
        ends; NOT_FOUND when there is none (basic_manager.cc `BasicManager::ServingMap::GetUntypedServableHandle`)."""
        with self._lock:
            servable = self._available.get(self._latest() if version is None else version)
            if servable is None:
                # basic_manager.cc GetUntypedServableHandle: the request's DebugString only
                raise not_found(f"Servable not found for request: {servable_request(self.name, version)}")
            self._refs[servable] += 1
        try:
            yield servable
        finally:
            with self._lock:
                self._refs[servable] -= 1
                release = servable in self._retiring and self._refs[servable] == 0
            if release:
                self._release(servable)

    def available_versions(self):
        """The AVAILABLE versions, sorted."""
        with self._lock:
            return sorted(self._available)

    @property
    def served_version(self):
        """The highest AVAILABLE version (the one a request without a version gets), None when none is."""
        with self._lock:
            return self._latest()

    def _latest(self):
        """The highest AVAILABLE version, None when none is (under `_lock`)."""
        return max(self._available, default=None)

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
