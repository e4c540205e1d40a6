"""Prometheus metrics of the embedded server: stock TF Serving's families under stock's names, and ours apart.

Served on the REST port at the MonitoringConfig's path when `--monitoring_config_file` enables it (stock's
model_servers/http_server.cc; `prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }`). Stock's
exporter (util/prometheus_exporter.cc) names a TF monitoring metric by replacing every character but [a-zA-Z0-9_]
with ":", so "/tensorflow/serving/request_count" is `:tensorflow:serving:request_count`. As stock records them
(servables/tensorflow/util.cc, prediction_service_impl.cc, http_server.cc, predict_util.cc):
    :tensorflow:serving:request_count{model_name,status}        counter: every Predict, Classify and Regress over
        gRPC and every REST model request, `status` the canonical code's name ("OK", "INVALID_ARGUMENT", ...)
    :tensorflow:serving:request_latency{model_name,API,entrypoint}  histogram, microseconds, successful requests
        only: API "Predict"/"Classify"/"Regress" on "GRPC", the URL's verb ("predict") on "REST"
    :tensorflow:serving:runtime_latency{model_name,API,runtime}  histogram, microseconds of the model call itself
        (runtime "TF2": a TF2 SavedModel function; stock's sessions say "TF1")
both histograms with TF's `Buckets::Exponential(10, 1.8, 33)`; and, as TF's loader (cc/saved_model/loader.cc) and
stock's batching session (batching/batching_session.cc) record them:
    :tensorflow:cc:saved_model:load_attempt_count{model_path,status}  counter, status "success" or "fail"
    :tensorflow:cc:saved_model:load_latency{model_path}          counter, microseconds spent loading
    :tensorflow:serving:batching_session:queuing_latency{thread_pool_name}  histogram, microseconds a request waited
        for a batch thread (Exponential(100, 1.2, 52); "batch_threads", the BatchingParameters default name)
    :tensorflow:serving:batching_session:wrapped_run_count        counter, model calls of the batch threads
Ours, under `elmo_serving_`:
    elmo_serving_requests_total{model,signature}, _model_calls_total, _rows_total, _merged_requests_total  batching
    elmo_serving_tokens_total{model}                 tokens of the sentences run (what the server's work scales with)
    elmo_serving_refused_total{reason}               requests refused before the model: in_flight (the cap),
                                                     deadline, draining, or the request budget's limit
                                                     (max_request_tokens, max_request_sentences, ...)
    elmo_serving_rest_bytes_in_flight                gauge: REST bodies and responses held
    elmo_serving_requests_in_flight                  gauge: Predict requests running or queued
    elmo_serving_version{model}                      gauge: the version a request without one gets (-1: none)
prometheus_client keeps the registry (one per server) and writes the text format. It appends "_total" to a
counter's name in the TYPE and HELP lines; stock's names have none, so those two lines of the stock counter are
written under stock's name (`exposition`): its samples, which we name, already carry it.
"""

import bisect
import threading

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

DEFAULT_PATH = "/monitoring/prometheus/metrics"  # stock's PrometheusExporter::kPrometheusPath
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = tuple(10.0 * 1.8**i for i in range(32))  # TF's Buckets::Exponential(10, 1.8, 33): the 33rd is +Inf
REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"
RUNTIME_LATENCY = ":tensorflow:serving:runtime_latency"
LOAD_ATTEMPTS = ":tensorflow:cc:saved_model:load_attempt_count"  # tensorflow/cc/saved_model/loader.cc
LOAD_LATENCY = ":tensorflow:cc:saved_model:load_latency"
QUEUING_LATENCY = ":tensorflow:serving:batching_session:queuing_latency"  # batching/batching_session.cc
WRAPPED_RUNS = ":tensorflow:serving:batching_session:wrapped_run_count"
QUEUING_BUCKETS = tuple(100.0 * 1.2**i for i in range(51))  # Buckets::Exponential(100, 1.2, 52)
STOCK_COUNTERS = (REQUEST_COUNT, LOAD_ATTEMPTS, LOAD_LATENCY, WRAPPED_RUNS)
BATCH_COUNTERS = (
    ("elmo_serving_requests", "requests", "Predict requests that reached the model"),
    ("elmo_serving_model_calls", "model_calls", "signature function calls (merged batches)"),
    ("elmo_serving_rows", "rows", "rows (sentences) run"),
    ("elmo_serving_merged_requests", "merged_requests", "requests that shared a model call"),
)
REFUSALS = (("in_flight", "rejected_in_flight"), ("deadline", "deadline_exceeded"), ("draining", "rejected_draining"))


class Histogram:
    """Counts of values per bucket (`limits`, then +Inf), their sum and count, as a TF monitoring Sampler keeps them;
    not thread-safe (its owner locks)."""

    __slots__ = ("limits", "counts", "total", "count")

    def __init__(self, limits=LATENCY_BUCKETS):
        self.limits = limits
        self.counts = [0] * (len(limits) + 1)
        self.total = 0.0
        self.count = 0

    def add(self, value):
        index = bisect.bisect_left(self.limits, value)  # the first limit >= value: Prometheus' "le"
        self.counts[index] += 1
        self.total += value
        self.count += 1

    def buckets(self):
        """[(le, cumulative count)] for prometheus_client's HistogramMetricFamily."""
        cumulative, out = 0, []
        for limit, n in zip((*self.limits, float("inf")), self.counts):
            cumulative += n
            out.append(("+Inf" if limit == float("inf") else repr(limit), cumulative))
        return out


class ServerMetrics:
    """The metrics of one server (`core`: its `ServerCore`, read at each scrape for the batching counters, the
    refusals, the requests in flight and the versions served). `record_request`, `record_latency` and
    `record_runtime` are called by the fronts and the core; `exposition()` is the scrape's body."""

    def __init__(self, core):
        self.core = core
        self._lock = threading.Lock()
        self._requests = {}  # (model_name, status) -> count
        self._latency = {}  # (family, labels) -> _Histogram
        self._tokens = {}  # model -> tokens run
        self._loads = {}  # (model_path, "success" or "fail") -> count
        self._load_micros = {}  # model_path -> microseconds spent loading
        self.gauges = {}  # name -> (help, callable): what a front adds (the REST bytes in flight)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def record_request(self, model_name, status):
        """One request of `model_name` ended with `status` (a `grpc.StatusCode`, or None for OK)."""
        key = (model_name or "", status.name if status is not None else "OK")
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1

    def record_latency(self, model_name, api, entrypoint, seconds):
        self._observe(REQUEST_LATENCY, (model_name, api, entrypoint), seconds)

    def record_runtime(self, model_name, api, seconds, runtime="TF2"):
        self._observe(RUNTIME_LATENCY, (model_name, api, runtime), seconds)

    def record_load(self, model_path, ok, seconds):
        """One SavedModel load of `model_path` (a version directory) that took `seconds`, as TF's loader counts it."""
        with self._lock:
            key = (model_path, "success" if ok else "fail")
            self._loads[key] = self._loads.get(key, 0) + 1
            self._load_micros[model_path] = self._load_micros.get(model_path, 0) + int(seconds * 1e6)

    def record_tokens(self, model_name, tokens):
        with self._lock:
            self._tokens[model_name] = self._tokens.get(model_name, 0) + int(tokens)

    def _observe(self, family, labels, seconds):
        with self._lock:
            histogram = self._latency.get((family, labels))
            if histogram is None:
                histogram = self._latency[(family, labels)] = Histogram()
            histogram.add(seconds * 1e6)

    def collect(self):
        """prometheus_client's collector protocol: the families, from what was recorded and the core's stats."""
        with self._lock:
            requests = dict(self._requests)
            latency = {key: (h.buckets(), h.total) for key, h in self._latency.items()}
            tokens = dict(self._tokens)
            loads, load_micros = dict(self._loads), dict(self._load_micros)
        family = Metric(LOAD_ATTEMPTS, "The number of times a SavedModel was successfully loaded.", "counter")
        for (path, status), value in sorted(loads.items()):
            family.add_sample(LOAD_ATTEMPTS, {"model_path": path, "status": status}, value)
        yield family
        family = Metric(
            LOAD_LATENCY, "Latency in microseconds for SavedModels that were successfully loaded.", "counter"
        )
        for path, value in sorted(load_micros.items()):
            family.add_sample(LOAD_LATENCY, {"model_path": path}, value)
        yield family
        queued, wrapped = self.core.batch_stats.queuing()
        histogram = HistogramMetricFamily(
            QUEUING_LATENCY, "Distribution of wall time spent (in microseconds) in queuing", labels=["thread_pool_name"]
        )
        if queued.count:
            histogram.add_metric(["batch_threads"], queued.buckets(), queued.total)
        yield histogram
        family = Metric(WRAPPED_RUNS, "Total count of run calls on the wrapped session", "counter")
        family.add_sample(WRAPPED_RUNS, {}, wrapped)
        yield family
        family = Metric(REQUEST_COUNT, "The total number of requests.", "counter")
        for (model_name, status), value in sorted(requests.items()):
            family.add_sample(REQUEST_COUNT, {"model_name": model_name, "status": status}, value)
        yield family
        for name, labels, help_text in (
            (REQUEST_LATENCY, ("model_name", "API", "entrypoint"), "Tensorflow Serving request"),
            (RUNTIME_LATENCY, ("model_name", "API", "runtime"), "Tensorflow runtime"),
        ):
            histogram = HistogramMetricFamily(
                name, f"Distribution of wall time (in microseconds) for {help_text}.", labels=labels
            )
            for (family_name, values), (buckets, total) in sorted(latency.items()):
                if family_name == name:
                    histogram.add_metric(list(values), buckets, total)
            yield histogram
        stats = self.core.stats()
        for name, key, help_text in BATCH_COUNTERS:
            counter = Metric(name, help_text, "counter")
            for label, counters in stats["by_signature"].items():
                model, signature = label.split("/", 1)
                counter.add_sample(f"{name}_total", {"model": model, "signature": signature}, counters.get(key, 0))
            yield counter
        counter = Metric("elmo_serving_tokens", "tokens of the sentences run", "counter")
        for model, value in sorted(tokens.items()):
            counter.add_sample("elmo_serving_tokens_total", {"model": model}, value)
        yield counter
        counter = Metric("elmo_serving_refused", "requests refused before the model ran, by reason", "counter")
        for reason, key in REFUSALS:
            counter.add_sample("elmo_serving_refused_total", {"reason": reason}, stats.get(key, 0))
        for limit, value in sorted(stats.get("refused_by_budget", {}).items()):
            counter.add_sample("elmo_serving_refused_total", {"reason": limit}, value)
        yield counter
        for name, (help_text, read) in sorted(self.gauges.items()):
            yield GaugeMetricFamily(name, help_text, value=read())
        yield GaugeMetricFamily(
            "elmo_serving_requests_in_flight", "Predict requests running or queued", value=stats["in_flight"]
        )
        versions = GaugeMetricFamily("elmo_serving_version", "the version served (-1: none)", labels=["model"])
        for model, version in sorted(stats["served_versions"].items()):
            versions.add_metric([model], version if version is not None else -1)
        yield versions

    def exposition(self):
        """The Prometheus text format of every family (bytes), stock's counter under stock's name."""
        text = generate_latest(self.registry)
        for name in STOCK_COUNTERS:
            stock = name.encode()
            text = text.replace(b"# HELP " + stock + b"_total ", b"# HELP " + stock + b" ")
            text = text.replace(b"# TYPE " + stock + b"_total counter", b"# TYPE " + stock + b" counter")
        return text
