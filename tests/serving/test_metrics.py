"""Prometheus metrics (elmo_tf/serving/metrics.py, `--monitoring_config_file`) scraped from a real server on 127.0.0.1
and parsed with prometheus_client's own parser: stock's families under stock's names and labels
(servables/tensorflow/util.cc: `/tensorflow/serving/request_count` {model_name, status}, `request_latency`
{model_name, API, entrypoint}, `runtime_latency` {model_name, API, runtime}; util/prometheus_exporter.cc turns "/"
into ":"), their counts equal to the requests sent (ok, refused, failed) over gRPC and REST, and ours apart."""

import json
import os

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rest_testlib import call
from serving_testlib import start_server

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.config_files import parse_monitoring_config
from elmo_tf.serving.serving_error import ServingError


@pytest.fixture(scope="module")
def monitored(base_path):
    server = start_server(base_path, prometheus_path="/monitoring/prometheus/metrics", max_request_sentences=4)
    yield server
    server.stop(grace=1.0)


def scrape(server):
    status, text = call(f"http://127.0.0.1:{server.rest_port}/monitoring/prometheus/metrics")
    assert status == 200, text
    return {family.name: family for family in text_string_to_metric_families(text)}, text


def samples(families, name, suffix=""):
    """{frozenset of labels: value} of the samples named `name + suffix` of family `name`."""
    return {frozenset(s.labels.items()): s.value for s in families[name].samples if s.name == name + suffix}


def test_counts_equal_the_requests_sent_over_grpc_and_rest(monitored):
    before, _ = scrape(monitored)
    target = f"127.0.0.1:{monitored.grpc_port}"
    with ElmoClient(target, "elmo", timeout=60, max_retries=0) as c:
        for _ in range(3):
            c.embed(["counted over gRPC"])
        refused = 0
        for sentences in (["one"] * 5, ["two"] * 6):  # above max_request_sentences 4: refused before the model
            with pytest.raises(ServingError) as e:
                c.embed(sentences)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused += 1
    with ElmoClient(target, "nope", timeout=60, max_retries=0) as c, pytest.raises(ServingError):
        c.embed(["an unknown model"])
    url = f"http://127.0.0.1:{monitored.rest_port}/v1/models/elmo:predict"
    for _ in range(2):
        assert call(url, "POST", {"instances": ["counted over REST"]})[0] == 200
    assert call(url, "POST", raw=b"{not json")[0] == 400

    after, text = scrape(monitored)
    name = ":tensorflow:serving:request_count"
    assert f"# TYPE {name} counter" in text and f"{name}{{" in text  # stock's name, no "_total"

    def delta(labels):
        key = frozenset(labels.items())
        return samples(after, name, "_total").get(key, 0) - samples(before, name, "_total").get(key, 0)

    assert delta({"model_name": "elmo", "status": "OK"}) == 3 + 2
    assert delta({"model_name": "elmo", "status": "RESOURCE_EXHAUSTED"}) == refused
    assert delta({"model_name": "elmo", "status": "INVALID_ARGUMENT"}) == 1  # the malformed REST body
    assert delta({"model_name": "nope", "status": "NOT_FOUND"}) == 1

    latency = ":tensorflow:serving:request_latency"
    assert after[latency].type == "histogram"
    counts = samples(after, latency, "_count")
    grpc_key = frozenset({"model_name": "elmo", "API": "Predict", "entrypoint": "GRPC"}.items())
    rest_key = frozenset({"model_name": "elmo", "API": "predict", "entrypoint": "REST"}.items())
    assert counts[grpc_key] - samples(before, latency, "_count").get(grpc_key, 0) == 3  # successes only
    assert counts[rest_key] - samples(before, latency, "_count").get(rest_key, 0) == 2
    buckets = [s for s in after[latency].samples if s.name == latency + "_bucket" and s.labels["entrypoint"] == "GRPC"]
    assert len(buckets) == 33 and buckets[0].labels["le"] == "10.0" and buckets[-1].labels["le"] == "+Inf"
    runtime = samples(after, ":tensorflow:serving:runtime_latency", "_count")
    assert runtime[frozenset({"model_name": "elmo", "API": "Predict", "runtime": "TF2"}.items())] >= 5

    loads = samples(after, ":tensorflow:cc:saved_model:load_attempt_count", "_total")
    assert loads == {
        frozenset(
            {"model_path": os.path.join(monitored.core.managers["elmo"].base_path, "1"), "status": "success"}.items()
        ): 1
    }
    assert (
        samples(after, ":tensorflow:cc:saved_model:load_latency", "_total")
        and "# TYPE :tensorflow:cc:saved_model:load_latency counter" in text
    )
    queuing = ":tensorflow:serving:batching_session:queuing_latency"
    waited = samples(after, queuing, "_count")[frozenset({"thread_pool_name": "batch_threads"}.items())]
    assert (
        waited - samples(before, queuing, "_count").get(frozenset({"thread_pool_name": "batch_threads"}.items()), 0)
        >= 5
    )
    assert samples(after, ":tensorflow:serving:batching_session:wrapped_run_count", "_total")[frozenset()] >= 1

    ours = samples(after, "elmo_serving_refused", "_total")
    assert {"in_flight", "deadline", "draining", "max_request_sentences"} <= set(dict(k)["reason"] for k in ours)
    assert samples(after, "elmo_serving_tokens", "_total")[frozenset({"model": "elmo"}.items())] >= 5 * 3
    assert samples(after, "elmo_serving_version")[frozenset({"model": "elmo"}.items())] == 1
    assert samples(after, "elmo_serving_requests_in_flight")[frozenset()] == 0
    assert ours[frozenset({"reason": "max_request_sentences"}.items())] >= refused  # the budget's limit, by its flag
    assert samples(after, "elmo_serving_rest_bytes_in_flight")[frozenset()] >= 0


def test_the_monitoring_config_is_read_as_stock_reads_it(tmp_path):
    config = tmp_path / "monitoring.config"
    config.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    assert parse_monitoring_config(str(config)) == "/metrics"
    config.write_text("prometheus_config { enable: true }\n")
    assert parse_monitoring_config(str(config)) == "/monitoring/prometheus/metrics"  # stock's kPrometheusPath
    config.write_text("prometheus_config { enable: false }\n")
    assert parse_monitoring_config(str(config)) is None
    for text, needle in (
        ("prometheus_config { enabled: true }", "cannot parse"),  # unknown field: stock's parser refuses it
        ('prometheus_config { enable: true path: "/v1/models" }', "not lie under /v1/"),
        ('prometheus_config { enable: true path: "metrics" }', "must start with /"),
    ):
        config.write_text(text)
        with pytest.raises(ValueError, match=needle):
            parse_monitoring_config(str(config))


def test_the_shipped_monitoring_config_serves_the_metrics(base_path):
    from serving_testlib import REPO

    path = parse_monitoring_config(str(REPO / "export" / "monitoring.config"))
    server = start_server(base_path, prometheus_path=path)
    try:
        families, _ = scrape(server)
        assert ":tensorflow:serving:request_count" in families and "elmo_serving_version" in families
        status, body = call(f"http://127.0.0.1:{server.rest_port}/v1/models/elmo")
        assert status == 200 and json.loads(json.dumps(body))["model_version_status"][0]["state"] == "AVAILABLE"
    finally:
        server.stop(0)
