"""Request admission of the server core: the cap on requests in flight over both fronts (`--max_requests_in_flight`),
draining (every new call refused UNAVAILABLE, REST 503), deadlines checked before a request runs, and the counters of
requests refused by each (`ServerCore.stats`). `core.ServerCore` is a `RequestAdmission`.
"""

import collections
import contextlib
import re
import threading
import time

import grpc

from elmo_tf.serving.serving_error import ServingError, resource_exhausted

_BUDGET_FLAG = re.compile(r"\(--(max_\w+)\)")  # the limit a request budget refusal names: "(--max_request_tokens)"


class RequestAdmission:
    """The in-flight cap, draining and deadlines of a server core, and its counters of refused requests.

    Subclasses set `options` (`ServerOptions`: `max_requests_in_flight`) and call `RequestAdmission.__init__`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last request in flight ends
        self._in_flight_count = 0
        self.draining = False  # set by `drain`: every new call is refused UNAVAILABLE (REST 503)
        self._counters = collections.Counter()  # requests refused at the in-flight cap or past their deadline

    def _count(self, key):
        with self._lock:
            self._counters[key] += 1

    @contextlib.contextmanager
    def _client_errors(self, manager):
        """Counts DEADLINE_EXCEEDED answers and requests the request budget refused (by the limit's flag, which its
        message names: `budget:max_request_tokens`, ...); takes the server's paths out of error messages."""
        try:
            yield
        except ServingError as e:
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._count("deadline_exceeded")
            elif e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                limit = _BUDGET_FLAG.search(e.details)
                if limit:
                    self._count(f"budget:{limit.group(1)}")
            raise ServingError(e.code, manager.redact(e.details), e.http_status) from None

    def drain(self):
        """From now on every new request is refused UNAVAILABLE (`check_open`); those in flight go on."""
        with self._lock:
            self.draining = True

    def check_open(self):
        """Raises UNAVAILABLE (REST 503) once the server is draining, as a front starts a call (counted as
        `rejected_draining`)."""
        if self.draining:
            self._count("rejected_draining")
            raise ServingError(
                grpc.StatusCode.UNAVAILABLE, "the server is shutting down: send the request to another replica", 503
            )

    def wait_idle(self, timeout):
        """Waits until no request is in flight (True) or `timeout` seconds pass (False)."""
        with self._idle:  # notified when the count reaches zero
            return self._idle.wait_for(lambda: not self._in_flight_count, timeout)

    @contextlib.contextmanager
    def _in_flight(self):
        limit = self.options.max_requests_in_flight
        with self._lock:
            refused = self.draining or self._in_flight_count >= limit
            if not refused:
                self._in_flight_count += 1
            elif not self.draining:
                self._counters["rejected_in_flight"] += 1
        if refused:
            self.check_open()
            raise resource_exhausted(
                f"the server is already handling {limit} requests, its limit of requests in flight "
                f"(--max_requests_in_flight {limit}): retry later"
            )
        try:
            yield
        finally:
            with self._lock:
                self._in_flight_count -= 1
                if not self._in_flight_count:
                    self._idle.notify_all()

    def _check_deadline(self, deadline, what):
        if deadline is not None and time.monotonic() >= deadline:
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's deadline passed {what}")
