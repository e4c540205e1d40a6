"""elmo_tf/serving/rest/rest_front.py, the HTTP transport, against hostile clients on 127.0.0.1 (issue 12, items 2 and
3), with raw sockets and http.client. Each case is bounded in time; after it a valid request is served within a few
seconds, and this process's RSS growth (the server runs in it) stays under a bound; the numbers are printed
(`pytest -s`).
    - a body above the limit: 413 (Content-Length before any of it is read; a chunked body at the limit);
    - REST bytes in flight past their cap: 429 at once;
    - 40 slow sockets (more than the old 32 handler threads) trickling headers or bodies: a normal client is served
      meanwhile, and the server closes them after the request deadline (408 for the bodies); a client that never
      reads its response is dropped after the deadline.
"""

import http.client
import json
import select
import socket
import threading
import time

from rest_testlib import (
    PREDICT,
    TIMEOUT_S,
    MiB,
    assert_still_serving,
    call,
    closed_within,
    post,
    read_response,
    report,
)
from serving_testlib import rss_mib, start_server

from elmo_tf.serving.rest.rest_front import DEFAULT_MAX_BODY_BYTES, LINGER_SECONDS


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
    """A ~12 MB response (far above the kernel's socket buffers) the client never reads: the server gives up after
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
        assert response.status == 200 and full > 8 * MiB
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


def test_body_above_the_limit_is_refused(base_path):
    server = start_server(base_path, enable_batching=False, max_message_bytes=1 << 16)
    try:
        url = f"http://127.0.0.1:{server.rest_port}/v1/models/elmo:predict"
        got, answer = call(url, "POST", {"inputs": ["x" * (1 << 17)]})
        assert got == 413 and "above the server's limit of 65536 bytes (--max_message_bytes)" in answer["error"]
        got, answer = call(url, "POST", {"inputs": ["still fine"]})
        assert got == 200
    finally:
        server.stop(grace=1.0)
