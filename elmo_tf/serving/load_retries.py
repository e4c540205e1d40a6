"""Failed loads of one model's versions, retried as TF Serving's loader retries them: `--max_num_load_retries` more
tries, `--load_retry_interval_micros` apart, then none until the version's files change (`source.files_fingerprint`).
`manager.ModelManager` holds a `LoadRetries`.
"""

import dataclasses
import logging
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2

from elmo_tf.saved_model.warmup import WarmupError
from elmo_tf.serving.serving_error import ServingError, status_code
from elmo_tf.serving.source import files_fingerprint

logger = logging.getLogger("elmo_tf.serving.manager")  # the manager's log, as before the split

State = get_model_status_pb2.ModelVersionStatus.State


@dataclasses.dataclass
class _Failures:
    """Failed loads of one version: how many, when the next may start (monotonic), the files they saw."""

    count: int
    next_try: float
    fingerprint: int


class LoadRetries:
    """The failed loads of model `name`'s versions (`_Failures` by version) and whether each may load again.

    Args:
        name: the model name (in log lines).
        options: `ServerOptions` (`max_num_load_retries`, `load_retry_interval_micros`).
    """

    def __init__(self, name, options):
        self.name = name
        self.options = options
        self._failures = {}  # version -> _Failures

    def forget_missing(self, versions):
        """Forgets the failures of versions no longer on disk (not in `versions`)."""
        for version in [v for v in self._failures if v not in versions]:
            del self._failures[version]

    def succeeded(self, version):
        self._failures.pop(version, None)

    def may_load(self, version, path):
        """Whether `version` may load now: never failed, its retry is due, or its files changed since it gave up."""
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

    def failed(self, version, path, error):
        """Records a failed load of `version` (`error`, the exception) and logs it; returns its model version status:
        `(State, grpc.StatusCode, message)`, END once `max_num_load_retries` retries failed, else START."""
        previous = self._failures.get(version)
        count = previous.count + 1 if previous else 1
        interval = self.options.load_retry_interval_micros / 1e6
        self._failures[version] = _Failures(count, time.monotonic() + interval, files_fingerprint(path))
        if isinstance(error, tf.errors.OpError):
            code = status_code(error.error_code)
        elif isinstance(error, ServingError):  # a request of the warmup file failed
            code = error.code
        elif isinstance(error, WarmupError):  # a warmup file TF Serving refuses
            code = grpc.StatusCode[error.code]
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
        return (State.END if final else State.START), code, message
