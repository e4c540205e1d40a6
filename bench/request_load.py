"""Closed-loop load on a served model: client threads, one connection each, sending requests back to back, started
together after one untimed request each; the latencies, wall time, errors and tokens of a timed phase, and their
summary (p50/p99 latency, sentences/s, tokens/s). Used by bench/serving_latency.py. NumPy and the standard library."""

import threading
import time

import numpy as np


def batch_at(sentences, request_batch, k, i):
    """The i-th request of client k: `request_batch` consecutive sentences from a spread-out start."""
    start = ((k * 7919 + i * 104729) * request_batch) % (len(sentences) - request_batch)
    return sentences[start : start + request_batch]


def _parallel(functions):
    errors = []

    def run(f):
        try:
            f()
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(f,), daemon=True) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def make_callers(make_caller, concurrency, sentences, request_batch):
    """`concurrency` callers (`make_caller() -> call(list_of_sentences)`, one connection each), each warmed up
    with one untimed request, all at once."""
    callers = [make_caller() for _ in range(concurrency)]
    errors = _parallel([lambda k=k: callers[k](batch_at(sentences, request_batch, k, -1)) for k in range(concurrency)])
    if errors:
        raise RuntimeError(f"warm-up failed: {errors[:3]}")
    return callers


def close_callers(callers):
    for call in callers:
        close = getattr(call, "close", None)
        if close is not None:
            close()


def measure(callers, requests, sentences, request_batch, offset=0):
    """Runs `requests` timed requests spread over the callers, one thread each, started together.
    Returns latencies (s), wall time (s) and errors."""
    concurrency = len(callers)
    per_thread = [requests // concurrency + (1 if k < requests % concurrency else 0) for k in range(concurrency)]
    latencies, errors, tokens = [], [], []
    lock = threading.Lock()
    ready = threading.Barrier(concurrency + 1)
    done = threading.Barrier(concurrency + 1)

    def worker(k):
        mine, failed, counted = [], [], 0
        ready.wait()
        for i in range(per_thread[k]):
            batch = batch_at(sentences, request_batch, k, offset + i)
            t0 = time.perf_counter()
            try:
                callers[k](batch)
                mine.append(time.perf_counter() - t0)
                counted += sum(len(s.split()) for s in batch)
            except Exception as e:
                failed.append(f"{type(e).__name__}: {e}")
        with lock:
            latencies.extend(mine)
            errors.extend(failed)
            tokens.append(counted)
        done.wait()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    done.wait()
    wall = time.perf_counter() - t0
    for t in threads:
        t.join()
    return latencies, wall, errors, sum(tokens)


def summarize(latencies, wall, errors, request_batch, tokens):
    lat = np.asarray(latencies) * 1000.0
    return {
        "requests": int(lat.size),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "mean_ms": float(lat.mean()) if lat.size else None,
        "sentences_per_s": lat.size * request_batch / wall if wall > 0 else None,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "wall_s": wall,
    }
