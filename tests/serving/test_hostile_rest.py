"""Hostile REST clients against a real server on 127.0.0.1 (issue 12, items 1-4), with raw sockets and http.client.

Each case is bounded in time; after it a valid request is served within a few seconds, and the growth of this
process's RSS (the server runs in it) stays under a bound; the numbers are printed (`pytest -s`).
    1. a predict whose JSON response would be ~4x the response limit: 429 naming the limit and its flag;
    2. a 60 MB declared body: 413 before any of it is read; a chunked body past the limit: 413 at the limit;
       REST bytes in flight past their cap: 429 at once;
    3. 40 slow sockets (more than the old 32 handler threads) trickling headers or bodies: a normal client is
       served meanwhile, and the server closes them after the request deadline (408 for the bodies);
       a client that never reads its response is dropped after the deadline;
    4. malformed and deeply nested JSON (arrays and objects, depth 65 to 100000), in every position: 400.
"""

import http.client
import json
import select
import socket
import threading
import time

import numpy as np
import pytest
from serving_testlib import start_server

from serving.rest import DEFAULT_MAX_BODY_BYTES, LINGER_SECONDS, outputs_to_json
from serving.status import ServingError

MiB = 1 << 20
TIMEOUT_S = 3.0  # rest_api_timeout_in_ms of the `strict` server
SMALL_LIMIT = 4 * MiB  # its max_message_bytes: response limit (and body limit, being under the REST default)
PREDICT = "/v1/models/elmo:predict"


@pytest.fixture(scope="module")
def strict(base_path):
    """A server with a 3 s request deadline and a 4 MiB message limit."""
    server = start_server(
        base_path, rest_api_timeout_in_ms=int(TIMEOUT_S * 1000), max_message_bytes=SMALL_LIMIT, enable_batching=False
    )
    yield server
    server.stop(grace=1.0)


def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def post(port, body, path=PREDICT, timeout=30):
    """(status, decoded JSON) of one POST with http.client."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None
    finally:
        connection.close()


def get(port, path, timeout=30):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def assert_still_serving(port, within=5.0):
    """A valid predict is answered 200 within `within` seconds; returns its latency."""
    start = time.monotonic()
    status, body = post(port, {"inputs": ["still serving ."], "output_filter": ["default"]}, timeout=within)
    elapsed = time.monotonic() - start
    assert status == 200 and len(body["outputs"]) == 1, body
    assert elapsed < within
    return elapsed


def read_response(sock, timeout=10.0):
    """(status, JSON body) of the HTTP response on a raw socket; (None, None) if it closed without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None, None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None, None
    return int(head.split()[1]), json.loads(rest[:length])


def closed_within(sock, seconds):
    """True when the peer closes `sock` (EOF or reset) within `seconds`, whatever it sends before."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([sock], [], [], max(0.0, end - time.monotonic()))
        if ready:
            try:
                if not sock.recv(65536):
                    return True
            except OSError:
                return True
    return False


def report(name, before, after, extra=""):
    print(f"\n[{name}] RSS {before:.0f} -> {after:.0f} MiB (+{after - before:.0f}){extra}")


# ---------------------------------------------------------------------------------------------------- 1. output


def test_json_response_over_the_limit_is_refused(strict):
    """Binary outputs under the 4 MiB limit, their JSON (~5x) about 4x over it: 429 naming the limit and flag."""
    rows, tokens = 40, 100
    binary = rows * tokens * (32 + 64 + 64 + 64) * 4  # word_emb, lstm_outputs1/2, elmo (float32) per token
    assert SMALL_LIMIT * 0.5 < binary < SMALL_LIMIT  # what gRPC would send is within the limit
    before = rss_mib()
    start = time.monotonic()
    status, body = post(strict.rest_port, {"inputs": [" ".join(["word"] * tokens)] * rows})
    elapsed = time.monotonic() - start
    after = rss_mib()
    report("json response 4x over", before, after, f", answered {status} in {elapsed:.2f} s")
    assert status == 429, body
    assert f"{SMALL_LIMIT}" in body["error"] or "4.0 MiB" in body["error"], body
    assert "--max_message_bytes" in body["error"], body
    assert after - before < 100
    assert_still_serving(strict.rest_port)
    status, body = post(strict.rest_port, {"inputs": ["a b"] * rows, "output_filter": ["default"]})
    assert status == 200  # a small response of as many rows is fine


def test_json_writer_stops_at_the_limit():
    """outputs_to_json never builds more than the limit (plus one row): it fails as soon as it passes it."""
    outputs = {"elmo": np.random.default_rng(0).standard_normal((64, 100, 64)).astype(np.float32)}
    limit = 1 * MiB
    with pytest.raises(ServingError) as error:
        outputs_to_json(outputs, row_format=False, limit=limit)
    assert error.value.code.name == "RESOURCE_EXHAUSTED" and error.value.http_status == 429
    assert f"more than {limit} bytes" in error.value.details and "--max_message_bytes" in error.value.details
    parts = outputs_to_json({"elmo": outputs["elmo"][:2]}, row_format=True, limit=limit)
    decoded = json.loads(b"".join(parts))
    np.testing.assert_array_equal(np.asarray(decoded["predictions"], np.float32), outputs["elmo"][:2])


# ---------------------------------------------------------------------------------------------------- 2. input size


def test_declared_60mb_body_is_refused_unread(server):
    """Content-Length 60 MB and no body sent: 413 at once (nothing read), then the connection closes."""
    before = rss_mib()
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(
            b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 60000000\r\n\r\n"
        )
        status, body = read_response(sock, timeout=5)
        elapsed = time.monotonic() - start
        assert status == 413, body
        assert "60000000 bytes" in body["error"] and f"limit of {DEFAULT_MAX_BODY_BYTES} bytes" in body["error"]
        assert "--rest_api_max_body_bytes" in body["error"]
        assert elapsed < 2
        assert closed_within(sock, LINGER_SECONDS + 3)
    after = rss_mib()
    report("60 MB declared", before, after, f", 413 in {elapsed * 1000:.0f} ms")
    assert after - before < 20
    assert_still_serving(server.rest_port)


def test_chunked_body_is_cut_at_the_limit(server):
    """A chunked body streamed past the limit (up to 3x it): 413 once the limit is passed; memory stays bounded."""
    before = rss_mib()
    chunk = b'["' + b"x" * (MiB - 5) + b'"],'
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent, status, body = 0, None, None
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"5\r\n" + b'{"x":' + b"\r\n"
        )
        start = time.monotonic()
        try:
            while sent < 3 * DEFAULT_MAX_BODY_BYTES and time.monotonic() - start < 20:
                ready, _, _ = select.select([sock], [], [], 0)
                if ready:
                    break
                sock.sendall(frame)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, body = read_response(sock, timeout=10)
        elapsed = time.monotonic() - start
    after = rss_mib()
    report("chunked past the limit", before, after, f", {sent / MiB:.0f} MiB sent, answered in {elapsed:.2f} s")
    assert status == 413, body
    assert f"more than {DEFAULT_MAX_BODY_BYTES} bytes" in body["error"] and "--rest_api_max_body_bytes" in body["error"]
    assert sent < 3 * DEFAULT_MAX_BODY_BYTES  # answered before the client was done
    assert after - before < 100
    assert_still_serving(server.rest_port)


def test_bytes_in_flight_cap_refuses_at_once(base_path):
    """With 64 KiB of REST bytes in flight allowed: a client holding 56 KiB of an unfinished body makes the next
    request (10 KiB) a 429 at once; once that body is complete both requests are served."""
    cap = 64 << 10
    server = start_server(base_path, rest_api_timeout_in_ms=int(TIMEOUT_S * 1000), rest_api_max_bytes_in_flight=cap)
    try:
        port = server.rest_port
        slow_body = b'{"inputs": ["held back"]}'.ljust(60 << 10)
        other = b'{"inputs": ["a b"], "output_filter": ["default"]}'.ljust(10 << 10)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Content-Length: {len(slow_body)}\r\n\r\n".encode()
                + slow_body[: 56 << 10]
            )
            time.sleep(0.3)
            start = time.monotonic()
            status, body = post(port, other, timeout=5)
            elapsed = time.monotonic() - start
            assert status == 429, body
            assert f"limit of {cap} bytes (--rest_api_max_bytes_in_flight)" in body["error"], body
            assert elapsed < 1
            sock.sendall(slow_body[56 << 10 :])
            status, body = read_response(sock)
            assert status == 200, body
        status, body = post(port, other)
        assert status == 200, body
        print(f"\n[bytes in flight] 429 in {elapsed * 1000:.0f} ms while 56 KiB were held; served once released")
    finally:
        server.stop(grace=1.0)


# ---------------------------------------------------------------------------------------------------- 3. slow clients


def test_slow_sockets_do_not_stop_other_clients(strict):
    """20 sockets trickle their headers and 20 their bodies, a byte every 0.1 s (40 > the old 32 handler threads):
    normal requests are served meanwhile; the server closes every slow socket after the 3 s deadline (the slow
    bodies get 408 first)."""
    port = strict.rest_port
    head = b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
    slow = []  # [socket, bytes still to trickle, kind, opened at, closed at, response]
    for k in range(40):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.setblocking(False)
        if k % 2:
            sock.sendall(head)
            slow.append([sock, b" " * 1000, "body", time.monotonic(), None, b""])
        else:
            slow.append([sock, head + b" " * 1000, "headers", time.monotonic(), None, b""])
    before = rss_mib()
    stop = threading.Event()

    def trickle():
        while not stop.is_set() and any(s[4] is None for s in slow):
            for entry in slow:
                sock, rest, _, _, closed, _ = entry
                if closed is not None:
                    continue
                try:
                    data = sock.recv(65536)
                    if not data:
                        entry[4] = time.monotonic()
                        continue
                    entry[5] += data
                except BlockingIOError:
                    pass
                except OSError:
                    entry[4] = time.monotonic()
                    continue
                try:
                    if rest:
                        sock.send(rest[:1])
                        entry[1] = rest[1:]
                except BlockingIOError:
                    pass
                except OSError:
                    entry[4] = time.monotonic()
            time.sleep(0.1)

    driver = threading.Thread(target=trickle, daemon=True)
    driver.start()
    try:
        time.sleep(0.5)
        latencies = [assert_still_serving(port, within=3.0) for _ in range(3)]
        driver.join(TIMEOUT_S + LINGER_SECONDS + 5)
        assert not driver.is_alive(), "some slow sockets are still open"
    finally:
        stop.set()
        driver.join(5)
        for entry in slow:
            entry[0].close()
    after = rss_mib()
    lifetimes = {kind: max(s[4] - s[3] for s in slow if s[2] == kind) for kind in ("headers", "body")}
    report(
        "40 slow sockets",
        before,
        after,
        f", normal requests served in {max(latencies) * 1000:.0f} ms; slowest closed after "
        f"{lifetimes['headers']:.1f} s (headers), {lifetimes['body']:.1f} s (bodies)",
    )
    assert lifetimes["headers"] < TIMEOUT_S + 2
    assert lifetimes["body"] < TIMEOUT_S + LINGER_SECONDS + 2
    for _sock, _, kind, _, _, response in slow:
        if kind == "body":
            assert response.startswith(b"HTTP/1.1 408"), response[:200]
            assert b"--rest_api_timeout_in_ms" in response
        else:
            assert response == b""  # an incomplete request gets no answer, just the close
    assert after - before < 50
    assert_still_serving(port)


def test_client_that_never_reads_its_response_is_dropped(base_path):
    """A ~20 MB response (far above the kernel's socket buffers) the client never reads: the server gives up after
    the 3 s deadline and drops the connection; other clients are served meanwhile; the memory is given back."""
    server = start_server(base_path, rest_api_timeout_in_ms=int(TIMEOUT_S * 1000), enable_batching=False)
    try:
        port = server.rest_port
        request = {"inputs": [" ".join(["word"] * 100)] * 160, "output_filter": ["elmo"]}  # 16000 tokens of work
        body = json.dumps(request).encode()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", PREDICT, body=body)  # read normally first: the allocators' high-water mark
        response = connection.getresponse()
        full = len(response.read())
        connection.close()
        assert response.status == 200 and full > 16 * MiB
        before = rss_mib()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small receive window
        sock.connect(("127.0.0.1", port))
        with sock:
            sock.sendall(
                b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.5)
            latency = assert_still_serving(port, within=3.0)
            time.sleep(TIMEOUT_S + 2)  # never read
            received = 0
            sock.settimeout(5)
            try:
                while chunk := sock.recv(1 << 16):
                    received += len(chunk)
            except OSError:
                pass
        after = rss_mib()
        report(
            "never-read response",
            before,
            after,
            f", {received / MiB:.1f} of {full / MiB:.1f} MiB received before the drop; another client served in "
            f"{latency * 1000:.0f} ms",
        )
        assert received < full / 2  # cut short: the server dropped the connection
        assert after - before < 100
        assert_still_serving(port)
    finally:
        server.stop(grace=1.0)


# ---------------------------------------------------------------------------------------------------- 4. malformed JSON


def nested(depth, kind="array", leaf='"a"'):
    if kind == "array":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


@pytest.mark.parametrize("depth", [65, 1000, 100000])
@pytest.mark.parametrize("kind", ["array", "object"])
def test_deeply_nested_json_is_400(strict, depth, kind):
    port = strict.rest_port
    value = nested(depth, kind)
    bodies = [
        value,  # the whole document
        '{"instances": ' + value + "}",
        '{"instances": [' + value + "]}",
        '{"inputs": ' + value + "}",
        '{"inputs": {"sentences": ' + value + "}}",
        '{"signature_name": "tokens", "inputs": {"tokens": ' + value + ', "sequence_len": [1]}}',
        '{"signature_name": "tokens", "instances": [{"tokens": ' + value + ', "sequence_len": 1}]}',
        '{"instances": ["a"], "output_filter": ' + value + "}",
        '{"signature_name": ' + value + ', "instances": ["a"]}',
        value[: len(value) // 2],  # truncated
    ]
    before = rss_mib()
    start = time.monotonic()
    for text in bodies:
        status, body = post(port, text.encode())
        assert status == 400, (text[:80], body)
        assert set(body) == {"error"}, body
    elapsed = time.monotonic() - start
    after = rss_mib()
    report(f"nested {kind} depth {depth}", before, after, f", {len(bodies)} bodies answered 400 in {elapsed:.2f} s")
    assert after - before < 50
    assert_still_serving(port)


def test_malformed_requests_are_400(strict):
    port = strict.rest_port
    cases = [
        b"",
        b"\xff\xfe{not utf-8",
        b'{"instances": ["a"]',
        b'{"instances": ["a"]} trailing',
        b'{"instances": [1' + b"0" * 5000 + b"]}",  # an integer too long to convert
        b'{"instances": ["\\ud800"]}',  # a lone surrogate
        b'{"signature_name": "tokens", "inputs": {"tokens": [[["a"]]], "sequence_len": [1]}}',
        b'{"signature_name": "tokens", "instances": [{"tokens": ["a"], "sequence_len": [[[1]]]}]}',
    ]
    for raw in cases:
        status, body = post(port, raw)
        assert status == 400, (raw[:60], body)
    status, body = get(port, "/v1/models/elmo/versions/" + "9" * 5000)
    assert status == 400 and "Failed to convert version" in body["error"], body
    assert_still_serving(port)
