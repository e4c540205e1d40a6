"""Server-side batching: concurrent requests to the same signature are merged into one model call.

Like TF Serving's `--enable_batching` (a shared batch scheduler with `max_batch_size`, `batch_timeout_micros`,
`num_batch_threads`, and `pad_variable_length_inputs`): each of `num_threads` workers takes the oldest waiting
request, adds the requests queued for the same signature whose width (tokens: the longest sentence, or the padded
input's width) is closest to its own while the merged batch stays within `max_batch_size` rows (a single larger
request runs alone, never split; a merged call runs as many LSTM steps as its widest request, so grouping similar
widths spares padded positions), optionally waits up to `batch_timeout` for more, and runs them in one call
(`elmo_tf.serving.batching.merge.run_batch`, which pads, merges and splits the outputs back). For a signature that takes
a sentence per row (`merge.regroupable`: ELMo's `default`) a worker takes up to `REGROUP_CALLS` x `max_batch_size`
rows and runs their sentences sorted by length, `max_batch_size` per call (`merge.run_regrouped`); so does it for a
signature the export's `packed` signature answers (`default`, `tokens`: `elmo_tf.serving.batching.packed`, several
sentences per row, `max_batch_size` rows per call).
With `batch_timeout` 0 (the default) nothing waits: requests merge when they queue up behind a busy model,
which is when merging pays, and a lone request pays no delay. A request whose deadline passes, or whose client
goes away, while it is queued is dropped before it runs (DEADLINE_EXCEEDED, CANCELLED).

`BatchStats` counts requests and model calls (`stats.snapshot()`; the REST server prints them at
`/monitoring/prometheus/metrics`): `model_calls < requests` shows merging at work.
"""

import collections
import dataclasses
import logging
import threading
import time

import grpc

from elmo_tf.serving.batching.merge import regroupable, run_batch
from elmo_tf.serving.config_files import MAX_BATCH_THREADS, MAX_BATCH_TIMEOUT
from elmo_tf.serving.metrics import QUEUING_BUCKETS, Histogram
from elmo_tf.serving.serving_error import ServingError

logger = logging.getLogger(__name__)

# a worker takes up to this many max_batch_size of rows of a `merge.regroupable` signature at once and runs them sorted
# by length, max_batch_size rows per call: the more rows to sort, the less padding each call runs
REGROUP_CALLS = 2


def _regrouped(runner):
    """Whether a merged call of `runner` regroups its sentences into calls of at most max_batch_size rows (sentences
    sorted by length, `merge.regroupable`; or packed into rows of several sentences, `elmo_tf.serving.batching.packed`),
    so a worker may take `REGROUP_CALLS` x max_batch_size sentences at once."""
    return regroupable(runner.signature) or getattr(runner, "packed", None) is not None


class BatchStats:
    """Thread-safe counters: requests, model calls, rows, and requests that shared a call, per signature."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counters = collections.defaultdict(collections.Counter)
        self._queued = Histogram(QUEUING_BUCKETS)  # microseconds requests waited for a batch thread
        self._wrapped_runs = 0  # model calls made by batch threads

    def record_batch(self, waits, num_calls):
        """A batch thread took requests that had waited `waits` seconds each, and made `num_calls` model calls."""
        with self._lock:
            for wait in waits:
                self._queued.add(wait * 1e6)
            self._wrapped_runs += num_calls

    def queuing(self):
        """(a copy of the queuing-time `Histogram`, the batch threads' model calls) for the Prometheus metrics."""
        with self._lock:
            copy = Histogram(self._queued.limits)
            copy.counts, copy.total, copy.count = list(self._queued.counts), self._queued.total, self._queued.count
            return copy, self._wrapped_runs

    def record_call(self, model_name, signature_name, num_requests, num_rows, num_calls=1):
        with self._lock:
            c = self._counters[(model_name, signature_name)]
            c["requests"] += num_requests
            c["model_calls"] += num_calls
            c["rows"] += num_rows
            if num_requests > 1:
                c["merged_requests"] += num_requests
            c["max_requests_per_call"] = max(c["max_requests_per_call"], num_requests)

    def snapshot(self):
        """`{"requests", "model_calls", "rows", "merged_requests", "max_requests_per_call", "by_signature":
        {"model/signature": {...}}}` summed over models and signatures."""
        with self._lock:
            by_signature = {f"{m}/{s}": dict(c) for (m, s), c in sorted(self._counters.items())}
        total = collections.Counter()
        for c in by_signature.values():
            for key, value in c.items():
                if key == "max_requests_per_call":
                    total[key] = max(total[key], value)
                else:
                    total[key] += value
        keys = ("requests", "model_calls", "rows", "merged_requests", "max_requests_per_call")
        return {**{k: int(total[k]) for k in keys}, "by_signature": by_signature}


@dataclasses.dataclass
class BatchingOptions:
    """Args:
    max_batch_size: rows (sentences) of a merged call.
    batch_timeout: seconds a worker waits for more requests once it holds one (0: merge only what queued).
    num_threads: workers, i.e. model calls that may run at once.
    """

    max_batch_size: int = 32
    batch_timeout: float = 0.0
    num_threads: int = 2

    def __post_init__(self):
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive int, got {self.max_batch_size!r}")
        if not 0 <= self.batch_timeout <= MAX_BATCH_TIMEOUT:
            raise ValueError(f"batch_timeout must be 0 to {MAX_BATCH_TIMEOUT:g} seconds, got {self.batch_timeout!r}")
        threads = self.num_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_BATCH_THREADS:
            raise ValueError(f"num_threads must be an int from 1 to {MAX_BATCH_THREADS}, got {threads!r}")


class _Task:
    __slots__ = ("request", "cancelled", "enqueued", "deadline", "done", "result", "abandoned")

    def __init__(self, request, cancelled, timeout):
        self.request = request
        self.cancelled = cancelled
        self.enqueued = time.monotonic()
        self.deadline = self.enqueued + timeout if timeout is not None else None
        self.done = threading.Event()
        self.result = None
        self.abandoned = False

    def skip(self):
        """Why the task must not run ("deadline", "cancelled"), or None."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "deadline"
        if self.abandoned or (self.cancelled is not None and self.cancelled()):
            return "cancelled"
        return None


class BatchScheduler:
    """Queues per signature and worker threads that run merged calls. One per loaded model version.

    Args:
        options: `BatchingOptions`.
        stats: `BatchStats` to count into.
        model_name, version: the model version served (for stats, thread names and logs).
    """

    def __init__(self, options, stats, model_name, version):
        self.options = options
        self.stats = stats
        self.model_name = model_name
        self.name = f"{model_name}/{version}"
        self._cond = threading.Condition()
        self._queues = collections.OrderedDict()  # runner -> deque of _Task
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-{self.name}-{k}", daemon=True)
            for k in range(options.num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, runner, request, timeout=None, cancelled=None):
        """Queues `request` (a `budget.Request`) to `runner` (a `servable.SignatureRunner`) and waits for its outputs
        (alias -> array, all outputs).

        Args:
            timeout: seconds to wait (None: no limit; the request's deadline); past it, DEADLINE_EXCEEDED and the
                request is dropped if it has not started.
            cancelled: optional callable, True when the caller went away (the request is then skipped).
        Raises:
            ServingError: the request's own error, DEADLINE_EXCEEDED, or UNAVAILABLE after `stop()`.
        """
        if timeout is not None and timeout > 1e6:  # Event.wait overflows on "no deadline" values
            timeout = None
        task = _Task(request, cancelled, timeout)
        with self._cond:
            if self._stopping:
                raise ServingError(grpc.StatusCode.UNAVAILABLE, f"model {self.name} is unloading; retry")
            self._queues.setdefault(runner, collections.deque()).append(task)
            self._cond.notify()
        if not task.done.wait(timeout):
            task.abandoned = True
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"deadline exceeded after {timeout:.3f} s waiting for the model (queued or running)",
            )
        if isinstance(task.result, ServingError):
            raise task.result
        return task.result

    def stop(self, timeout=None):
        """Runs what is queued, then ends the workers (waits up to `timeout` seconds for them)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    # ------------------------------------------------------------------------------------------------ workers

    @staticmethod
    def _drop(task, why):
        if why == "deadline":
            task.result = ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "the request's deadline passed while it waited for the model"
            )
        else:
            task.result = ServingError(grpc.StatusCode.CANCELLED, "the request was cancelled")
        task.done.set()

    def _pop_live(self, queue, tasks):
        """The oldest task of `queue` that must still run, appended to `tasks` (None: the queue held none); those past
        their deadline or cancelled are answered and dropped. A task is held in `tasks` as soon as it leaves `queue`."""
        while queue:
            task = queue.popleft()
            tasks.append(task)
            why = task.skip()
            if why is None:
                return task
            tasks.pop()
            self._drop(task, why)
        return None

    def _take(self, tasks):
        """Under the lock: the next batch's runner, its tasks appended to `tasks` as soon as they leave the queue (so
        that the caller can answer them if this fails half-way), or None when stopping and nothing is left."""
        while True:
            heads = [(queue[0].enqueued, k, runner) for k, (runner, queue) in enumerate(self._queues.items()) if queue]
            if heads:
                _, _, runner = min(heads)
                queue = self._queues[runner]
                first = self._pop_live(queue, tasks)
                if first is None:
                    continue
                break
            if self._stopping:
                return None
            self._cond.wait()
        rows = first.request.batch
        if not runner.signature.mergeable:
            return runner
        largest = self.options.max_batch_size  # a larger request runs alone
        limit = largest * REGROUP_CALLS if _regrouped(runner) and rows <= largest else largest

        def fill():
            nonlocal rows
            for task in list(queue):
                why = task.skip()
                if why is not None:
                    queue.remove(task)
                    self._drop(task, why)
            # the queued requests closest in width (tokens) to the oldest one, oldest first among equals: a merged call
            # runs as many steps as its longest sentence, so similar widths waste the fewest padded positions
            width = first.request.time_estimate
            chosen = []
            for task in sorted(queue, key=lambda t: abs(t.request.time_estimate - width)):  # sorted() is stable
                if task.request.batch <= largest and rows + task.request.batch <= limit:
                    chosen.append(task)
                    rows += task.request.batch
            tasks.extend(sorted(chosen, key=lambda t: t.enqueued))  # held before they leave the queue
            for task in chosen:
                queue.remove(task)

        fill()
        if self.options.batch_timeout > 0:
            deadline = first.enqueued + self.options.batch_timeout
            while rows < limit and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)  # at most MAX_BATCH_TIMEOUT: BatchingOptions bounds it
                fill()
        return runner

    def _work(self):
        """A worker's loop. It never ends but at stop: an exception anywhere in it (a bug) is logged and answered as
        INTERNAL to the requests it held, and the worker goes on with the next batch."""
        while True:
            tasks = []
            try:
                if not self._work_once(tasks):
                    return
            except Exception as e:  # noqa: BLE001 - a worker thread must not die: every caller would wait in vain
                logger.exception(
                    "batch worker of %s failed; its %d request(s) answered INTERNAL", self.name, len(tasks)
                )
                error = ServingError(grpc.StatusCode.INTERNAL, f"batch worker failed: {type(e).__name__}: {e}")
                for task in tasks:
                    if not task.done.is_set():
                        task.result = error
                        task.done.set()

    def _work_once(self, tasks):
        """Takes one batch into `tasks`, runs it and answers it; False once stopping with nothing left."""
        with self._cond:
            runner = self._take(tasks)
        if runner is None:
            return False
        taken = time.monotonic()
        rows = sum(t.request.batch for t in tasks)
        calls = -(-rows // self.options.max_batch_size) if len(tasks) > 1 and _regrouped(runner) else 1
        self.stats.record_batch([taken - t.enqueued for t in tasks], calls)
        try:
            results = run_batch(runner, [t.request for t in tasks], self.options.max_batch_size)
        except Exception as e:  # run_batch catches per request; this is a bug guard
            logger.exception("batch of %d requests to %s failed", len(tasks), runner.name)
            results = [ServingError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")] * len(tasks)
        self.stats.record_call(self.model_name, runner.name, len(tasks), rows, calls)
        if len(tasks) > 1:
            what = (self.name, len(tasks), rows, calls, runner.name)
            logger.debug("%s: merged %d requests (%d rows) into %d call(s) of %s", *what)
        for task, result in zip(tasks, results):
            task.result = result
            task.done.set()
        return True
