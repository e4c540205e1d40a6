"""elmo_tf/serving/batching/scheduler.py: concurrent requests merge into fewer model calls (the real model over gRPC,
and a fake signature), each request gets exactly its own outputs, big requests run alone, deadlines and stop are
handled."""

import re
import threading
import time

import grpc
import numpy as np
import pytest
from serving_fake import fake_runner
from serving_testlib import assert_parity, reference_sentences, reference_tokens, start_server

from elmo_tf.serving.batching import scheduler as batching_module
from elmo_tf.serving.batching.scheduler import BatchingOptions, BatchScheduler, BatchStats
from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.serving_error import ServingError


def test_scheduler_merges_up_to_max_batch_size_and_runs_big_requests_alone():
    calls = []
    runner = fake_runner(delay=0.05, calls=calls)
    stats = BatchStats()
    scheduler = BatchScheduler(BatchingOptions(max_batch_size=4, batch_timeout=0.3, num_threads=1), stats, "fake", 1)
    results = {}

    def send(k, rows):
        results[k] = scheduler.submit(
            runner, runner.budget.prepare({"x": np.full((rows, 2), k, np.float32)}), timeout=30
        )

    try:
        threads = [threading.Thread(target=send, args=(k, rows)) for k, rows in enumerate([1, 1, 1, 1, 6, 2])]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join(30)
    finally:
        scheduler.stop(5)
    for k, rows in enumerate([1, 1, 1, 1, 6, 2]):
        np.testing.assert_array_equal(results[k]["y"], np.full((rows, 2), 2 * k))
    assert max(shape[0] for shape in calls) == 6  # the 6-row request ran alone, never split
    assert all(shape[0] <= 4 for shape in calls if shape[0] != 6)
    snapshot = stats.snapshot()
    assert snapshot["requests"] == 6 and snapshot["model_calls"] < 6 and snapshot["merged_requests"] >= 2


def test_scheduler_deadline_and_stop():
    runner = fake_runner(delay=0.5)
    scheduler = BatchScheduler(BatchingOptions(max_batch_size=1, num_threads=1), BatchStats(), "fake", 1)
    request = runner.budget.prepare({"x": np.ones((1, 1), np.float32)})
    blocker = threading.Thread(target=scheduler.submit, args=(runner, request), kwargs={"timeout": 30})
    blocker.start()
    time.sleep(0.1)
    with pytest.raises(ServingError) as info:
        scheduler.submit(runner, request, timeout=0.1)  # queued behind a 0.5 s call
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    blocker.join(30)
    scheduler.stop(5)
    with pytest.raises(ServingError) as info:
        scheduler.submit(runner, request, timeout=1)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_a_failing_worker_answers_what_it_held_and_goes_on(monkeypatch, caplog):
    """A bug in a batch worker (here: an exception while it takes a request from the queue, injected once) is
    logged, the request it held is answered INTERNAL at once (not left to its deadline), and the same worker serves
    the next request: the thread never dies (issue 38: an OverflowError killed it, and every later request waited
    out its deadline)."""
    runner = fake_runner(delay=0.0)
    scheduler = BatchScheduler(BatchingOptions(max_batch_size=4, num_threads=1), BatchStats(), "fake", 1)
    request = runner.budget.prepare({"x": np.ones((1, 2), np.float32)})
    skip, failures = batching_module._Task.skip, []

    def fail_once(task):
        if not failures:
            failures.append(task)
            raise RuntimeError("injected")
        return skip(task)

    monkeypatch.setattr(batching_module._Task, "skip", fail_once)
    try:
        start = time.monotonic()
        with pytest.raises(ServingError) as info:
            scheduler.submit(runner, request, timeout=30)
        assert info.value.code == grpc.StatusCode.INTERNAL
        assert "batch worker failed: RuntimeError: injected" in str(info.value)
        assert time.monotonic() - start < 10  # answered by the worker, not by the 30 s deadline
        np.testing.assert_array_equal(scheduler.submit(runner, request, timeout=30)["y"], np.full((1, 2), 2.0))
        assert all(thread.is_alive() for thread in scheduler._threads)
    finally:
        scheduler.stop(5)
    assert "batch worker of fake/1 failed" in caplog.text and "RuntimeError: injected" in caplog.text


def test_batching_options_bound_the_timeout_and_the_threads():
    """A timeout the worker's wait cannot take (10^16 microseconds overflowed it) and more threads than may start."""
    for kwargs, message in [
        ({"batch_timeout": 1e10}, "batch_timeout must be 0 to 60 seconds, got 10000000000.0"),
        ({"batch_timeout": -1.0}, "batch_timeout must be 0 to 60 seconds"),
        ({"num_threads": 5000}, "num_threads must be an int from 1 to 1024, got 5000"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            BatchingOptions(**kwargs)


# ---------------------------------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def batching_server(base_path):
    """One batch thread that waits 300 ms for batch-mates, and no token limit."""
    server = start_server(
        base_path,
        batching=BatchingOptions(max_batch_size=64, batch_timeout=0.3, num_threads=1),
        max_tokens_per_sentence=None,
    )
    yield server
    server.stop(grace=1.0)


def test_concurrent_requests_merge_into_fewer_model_calls(batching_server, model):
    before = batching_server.core.stats()
    jobs = []
    for k in range(8):
        sentences = [" ".join(f"m{k}w{i}" for i in range(2 + 3 * k + j)) for j in range(1 + k % 3)]
        if k == 6:  # only empty sentences: its outputs have width 0 even when merged with longer ones
            jobs.append(("default", ["", "   "]))
        elif k % 2:
            jobs.append(("tokens", [s.split() for s in sentences]))
        else:
            jobs.append(("default", sentences))
    expected = [reference_tokens(model, x) if sig == "tokens" else reference_sentences(model, x) for sig, x in jobs]
    results, failures = {}, []
    barrier = threading.Barrier(8)

    def worker(k):
        signature, inputs = jobs[k]
        try:
            with ElmoClient(f"127.0.0.1:{batching_server.grpc_port}", "elmo", timeout=60) as c:
                barrier.wait(timeout=30)
                results[k] = c.embed_tokens(inputs) if signature == "tokens" else c.embed(inputs)
        except Exception as e:
            failures.append(f"{k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    for k in range(8):  # each request gets its own rows, at its own width
        assert_parity(expected[k], results[k])
    after = batching_server.core.stats()
    requests = after["requests"] - before["requests"]
    calls = after["model_calls"] - before["model_calls"]
    assert requests == 8
    assert calls < requests, after
    assert after["max_requests_per_call"] >= 2


def test_10000_token_sentence_served_without_a_token_limit(batching_server, model):
    sentence = " ".join(f"t{i % 97}" for i in range(10000))
    with ElmoClient(f"127.0.0.1:{batching_server.grpc_port}", "elmo", timeout=120) as c:
        out = c.embed([sentence], output_filter=["default", "sequence_len", "elmo"])
    assert out["elmo"].shape == (1, 10000, 64)
    assert_parity(reference_sentences(model, [sentence]), out, keys=["default", "sequence_len", "elmo"])


@pytest.mark.parametrize("regroup", [False, True, "packed"])
def test_queued_requests_of_similar_widths_share_a_call(monkeypatch, regroup):
    """The oldest request goes first, with the queued requests closest to its width (tokens): [40, 38] then [10, 12],
    not [40, 10] then [38, 12] in arrival order (1,248 padded positions of work instead of 832 for the same rows).
    A signature whose sentences can be regrouped by length (merge.regroupable) takes twice max_batch_size rows at once:
    all four, for merge.run_batch to sort into calls of max_batch_size rows; so does a signature the export's `packed`
    signature answers (`tokens`: not regroupable, but its sentences are packed into rows,
    elmo_tf.serving.batching.packed)."""
    from types import SimpleNamespace

    import elmo_tf.serving.batching.scheduler as batching
    from elmo_tf.serving.limits.budget import Request

    groups, release = [], threading.Event()

    def run_batch(runner, requests, max_rows=None):
        assert max_rows == 16
        groups.append([r.time_estimate for r in requests])
        if len(groups) == 1:
            release.wait(30)  # hold the only worker until every other request is queued
        return [{"w": r.time_estimate} for r in requests]

    monkeypatch.setattr(batching, "run_batch", run_batch)

    class Runner:  # hashable: the scheduler keeps a queue per runner
        name = "x"
        signature = SimpleNamespace(
            mergeable=True,
            inputs={"x": None},
            sentence_inputs=("x",) if regroup is True else (),
            lengths_output="n" if regroup is True else None,
        )
        packed = object() if regroup == "packed" else None

    runner = Runner()
    scheduler = BatchScheduler(BatchingOptions(max_batch_size=16, num_threads=1), BatchStats(), "fake", 1)
    results = {}

    def send(width):
        request = Request(inputs={}, batch=8, width=0, time_estimate=width, output_filter=())
        results[width] = scheduler.submit(runner, request, timeout=30)["w"]

    threads = [threading.Thread(target=send, args=(width,)) for width in (5, 40, 10, 38, 12)]
    try:
        threads[0].start()
        wait_until(lambda: groups, "the first call")
        for t in threads[1:]:
            t.start()
            time.sleep(0.05)  # arrival order 40, 10, 38, 12
        release.set()
        for t in threads:
            t.join(30)
    finally:
        release.set()
        scheduler.stop(5)
    assert groups == ([[5], [40, 10, 38, 12]] if regroup else [[5], [40, 38], [10, 12]])
    assert results == {5: 5, 40: 40, 10: 10, 38: 38, 12: 12}  # each request got its own answer


def wait_until(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
