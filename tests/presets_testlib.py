"""A real HTTP file server on 127.0.0.1 for the download tests, with faults a test turns on per path.

`FileServer` (http.server, one thread per request) serves `files` ({url path: bytes}) with an ETag, Last-Modified,
Content-Length, Range (206 + Content-Range) and If-Range, as S3 and GCS answer. A test sets `faults[path]`:
    drop_after=N       send the headers of the whole body, N bytes of it, then close the connection (`drops` times)
    ignore_range=True  answer every request 200 with the whole file
    ignore_if_range=True  honour a Range whatever its If-Range says (as some CDNs do)
    statuses=[500,..]  answer these statuses first, one per request
    redirects=K        a chain of K 302s before the file (as Kaggle's download link)
    stall_after=N      send N bytes, then nothing until the server stops (the client's timeout has to act)
    rate=B             at most B bytes per second (a download long enough to be killed)
    then=S             once the file has been answered once, answer status S (a call cut short by a fault ends)
    validators=V       "strong" (default: a strong ETag and Last-Modified), "weak" (the weak ETag W/"v1", the same
                       whatever the bytes, and Last-Modified), "last-modified" (no ETag) or "none"; If-Range is
                       compared as a careless server does (equal strings, weak or not, dates included)
    etag_every_response=True  a new strong ETag on every answer (a server that changes the file on every resume)
    drop_fresh_after=N  an answer to a GET without Range is cut after N bytes, every time
    gone_after=N       once N requests have reached the file, answer 404 (ends a test of a loop that should have)
    location=L         answer every request with a 302 to L (another scheme, another host)
    no_length=True     no Content-Length: the body ends when the connection closes
    endless=N          no Content-Length, and N bytes of zeros after the file's bytes (a body without end, cut short
                       only so that a client without a bound still finishes)
    content_length=N   declare Content-Length N whatever the body, and close the connection after it
    chunked_length=N   send the body chunked and also declare Content-Length N (urllib3 reads the chunks)
and reads `requests` (a list of (path, Range header or None)). Every wait is bounded: the server stops with the test.
"""

import contextlib
import email.utils
import hashlib
import http.server
import json
import threading
import time
import urllib.parse
from pathlib import Path


class FileServer:
    def __init__(self, files=None):
        self.files = dict(files or {})
        self.faults = {}
        self.requests = []
        self.etags = {}
        self._responses = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                server._handle(self)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that went away mid-body (the tests' own timeouts and kills)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def etag(self, path):
        return self.etags.get(path) or '"' + hashlib.sha256(self.files[path]).hexdigest()[:16] + '"'

    def gets(self, path):
        """The Range headers of the GETs of `path` that reached the file (after redirects), in order."""
        return [rng for p, rng in self.requests if p == path]

    def _handle(self, handler):
        parts = urllib.parse.urlsplit(handler.path)
        path = parts.path.lstrip("/")
        query = urllib.parse.parse_qs(parts.query)
        fault = self.faults.get(path, {})
        hop = int(query.get("hop", ["0"])[0])
        if fault.get("location"):
            handler.send_response(302)
            handler.send_header("Location", fault["location"])
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if hop < fault.get("redirects", 0):
            handler.send_response(302)
            handler.send_header("Location", f"/{path}?hop={hop + 1}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        with self._lock:
            self.requests.append((path, handler.headers.get("Range")))
            statuses = fault.get("statuses")
            status = statuses.pop(0) if statuses else None
            if status is None and fault.get("answered") and fault.get("then"):
                status = fault["then"]
            if status is None and fault.get("gone_after") is not None:
                reached = sum(1 for p, _ in self.requests if p == path)
                status = 404 if reached > fault["gone_after"] else None
            self._responses += 1
            serial = self._responses
            if status is None and path in self.files:
                fault["answered"] = True
        if status is not None or path not in self.files:
            status = status or 404
            body = f"error {status}".encode()
            handler.send_response(status)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        data = self.files[path]
        validators = fault.get("validators", "strong")
        etag = {"strong": self.etag(path), "weak": 'W/"v1"'}.get(validators)
        if etag and fault.get("etag_every_response"):
            etag = f'"response-{serial}"'
        modified = None if validators == "none" else email.utils.formatdate(1_700_000_000, usegmt=True)
        start = 0
        rng = handler.headers.get("Range")
        if_range = handler.headers.get("If-Range")
        matches = if_range is None or if_range in (etag, modified)
        if rng and not fault.get("ignore_range") and (matches or fault.get("ignore_if_range")):
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        body = data[start:]
        if fault.get("endless") is not None:
            body += bytes(fault["endless"])
        closing = any(fault.get(k) is not None for k in ("no_length", "endless", "content_length"))
        if fault.get("chunked_length") is not None:
            handler.send_header("Transfer-Encoding", "chunked")
            handler.send_header("Content-Length", str(fault["chunked_length"]))
        elif fault.get("content_length") is not None:
            handler.send_header("Content-Length", str(fault["content_length"]))
        elif not closing:
            handler.send_header("Content-Length", str(len(body)))
        if closing:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        if etag:
            handler.send_header("ETag", etag)
        if modified:
            handler.send_header("Last-Modified", modified)
        handler.send_header("Accept-Ranges", "none" if fault.get("ignore_range") else "bytes")
        handler.end_headers()
        if fault.get("chunked_length") is not None:
            for i in range(0, len(body), 1 << 16):
                piece = body[i : i + (1 << 16)]
                handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            handler.wfile.write(b"0\r\n\r\n")
            return
        self._send(handler, path, body, fault, fresh=rng is None)

    def _send(self, handler, path, body, fault, fresh=True):
        cut = None
        with self._lock:
            if fault.get("drop_after") is not None and fault.get("drops", 1) > 0:
                fault["drops"] = fault.get("drops", 1) - 1
                cut = fault["drop_after"]
            if fresh and fault.get("drop_fresh_after") is not None:
                cut = fault["drop_fresh_after"]
        stall = fault.get("stall_after")
        rate = fault.get("rate")
        sent, step = 0, 4096 if rate else 1 << 16
        try:
            while sent < len(body):
                if cut is not None and sent >= cut:
                    handler.close_connection = True
                    return
                if stall is not None and sent >= stall:
                    handler.wfile.flush()
                    self._stop.wait(60)
                    return
                end = min(len(body), sent + step, cut if cut is not None else len(body))
                if stall is not None:
                    end = min(end, stall) if sent < stall else end
                handler.wfile.write(body[sent:end])
                sent = end
                if rate:
                    handler.wfile.flush()
                    if self._stop.wait(step / rate):
                        return
        except (BrokenPipeError, ConnectionResetError):
            return


def wait_for(predicate, timeout=30.0):
    """Polls `predicate` until true (returns True) or `timeout` seconds pass (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def served_models(tmp_path, monkeypatch, models):
    """Serves `models` ({name: {file name: bytes}}) from a `FileServer` as bilm-hdf5 registry entries that
    `ELMO_TF_REGISTRY` adds (a name already registered, such as "original", is replaced), with `ELMO_TF_HOME` at
    `tmp_path / "home"` and ELMO_TF_OFFLINE unset; yields the server."""
    files = {f"{name}/{file}": data for name, entry in models.items() for file, data in entry.items()}
    with FileServer(files) as server:
        registry = {}
        for name, entry in models.items():
            specs = {file: {"url": server.url(f"{name}/{file}"), "size": len(data)} for file, data in entry.items()}
            registry[name] = {"format": "bilm-hdf5", "description": f"test model {name}", "language": "en"}
            registry[name]["files"] = specs
        path = tmp_path / "registry.json"
        path.write_text(json.dumps({"format": 1, "models": registry}))
        monkeypatch.setenv("ELMO_TF_REGISTRY", str(path))
        monkeypatch.setenv("ELMO_TF_HOME", str(tmp_path / "home"))
        monkeypatch.delenv("ELMO_TF_OFFLINE", raising=False)
        yield server


ALLENNLP = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"


def allennlp_model():
    """`{file name: bytes}` of AllenNLP's test biLM (options.json, weights.hdf5) for `served_models`; skips the test
    when ../shared is absent."""
    import pytest

    if not (ALLENNLP / "lm_weights.hdf5").is_file():
        pytest.skip(f"AllenNLP fixtures not found at {ALLENNLP}")
    return {
        "options.json": (ALLENNLP / "options.json").read_bytes(),
        "weights.hdf5": (ALLENNLP / "lm_weights.hdf5").read_bytes(),
    }
