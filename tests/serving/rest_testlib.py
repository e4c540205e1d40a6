"""Helpers of the REST tests: HTTP calls with http.client and raw sockets, and the limits of the `strict` server
(conftest.py)."""

import http.client
import json
import select
import time
import urllib.parse

import numpy as np

from elmo_tf.serving.limits.byte_units import MiB

TIMEOUT_S = 3.0  # rest_api_timeout_in_ms of the `strict` server
SMALL_LIMIT = 4 * MiB  # its max_message_bytes: response limit (and body limit, being under the REST default)
PREDICT = "/v1/models/elmo:predict"


def call(url, method="GET", body=None, raw=None, headers=None):
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        connection.request(method, parts.path, body=payload, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, (
            json.loads(data) if response.getheader("Content-Type", "").startswith("application/json") else data.decode()
        )
    finally:
        connection.close()


def arrays(outputs):
    result = {}
    for key, value in outputs.items():
        array = np.asarray(value)
        result[key] = array.astype(np.float32) if array.dtype.kind == "f" else array
    return result


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
