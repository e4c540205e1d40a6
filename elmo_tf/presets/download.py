"""One file from a URL (or a mirror directory) to a path: resumed, retried, verified, and only then in place.

`fetch(url, target, expected)` writes `.<name>.partial` beside `target` and, beside that, `.<name>.partial.json`
(the URL, the server's ETag and Last-Modified, the total size). The final name appears only once the whole file is
there and matches `expected` (size, SHA-256 / MD5 / SHA-1 where known): a reader never sees part of a file, and a
file that does not match is deleted, never cached. What `keras.utils.get_file` and allennlp's `cached_path` do not:
- an interrupted download (a dropped connection, a stalled server, kill -9, Ctrl-C) resumes from the bytes on disk
  with an HTTP Range request and `If-Range` (the ETag, else Last-Modified); a server that answers 200 instead of 206
  (it ignores ranges, or the file changed) or a 206 under another ETag starts over, with a warning;
- 5xx, 429, dropped connections and stalls (no byte for `timeout` seconds) are retried with exponential backoff;
  the count of tries starts again whenever a try brought bytes, so a flaky link still finishes a large file;
- 4xx (403, 404, ...) and a wrong size or checksum are one-line `DownloadError`s naming the file and the URL.
Callers serialize downloads of one target with a lock (`elmo_tf.presets.cache`); `fetch` itself takes none.
requests does the HTTP (redirects, chunked bodies, a truncated body detected from Content-Length); the Range and
If-Range protocol, the retry loop and the verification are written here: requests has no resume, and urllib3's Retry
retries a request from its start, not from the bytes already written.
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import urllib.parse

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import write_json

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
CHUNK = 1 << 20  # hashing
NET_CHUNK = 1 << 16  # what a broken connection can lose: bytes are on disk once a read of this size returns
HASHES = ("sha256", "md5", "sha1")


class DownloadError(ElmoTFError):
    """A file that could not be downloaded or did not verify. Nothing of it is left under its final name."""


class Expected:
    """What a downloaded file must be: `size` in bytes and hex digests (`sha256`, `md5`, `sha1`), each None when
    unknown. `describe()` names the known ones."""

    def __init__(self, size=None, sha256=None, md5=None, sha1=None):
        self.size = size
        self.sha256, self.md5, self.sha1 = sha256, md5, sha1

    def digests(self):
        return {name: getattr(self, name).lower() for name in HASHES if getattr(self, name)}


def partial_paths(target):
    """`(partial file, its state JSON)` of `target`: hidden names beside it."""
    directory, name = os.path.split(os.path.abspath(target))
    partial = os.path.join(directory, f".{name}.partial")
    return partial, partial + ".json"


def discard_partial(target):
    for path in partial_paths(target):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def file_digests(path, names=HASHES):
    """`{name: hex digest}` of `path`'s bytes for each hash in `names` (one pass)."""
    hashers = {name: hashlib.new(name) for name in names}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def verify(path, expected, what):
    """`{"size", "sha256"}` of `path`, or `DownloadError` when its size or a digest differs from `expected`."""
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        raise DownloadError(f"{what}: {size} bytes, expected {expected.size}: refused, nothing cached", path=path)
    wanted = expected.digests()
    digests = file_digests(path, sorted({"sha256", *wanted}))
    for name, value in wanted.items():
        if digests[name] != value:
            raise DownloadError(
                f"{what}: {name} {digests[name]}, expected {value}: refused, nothing cached (a corrupt or changed "
                "download)",
                path=path,
            )
    return {"size": size, "sha256": digests["sha256"]}


def mirrored(url, mirror):
    """`url` under `mirror` (a base URL or a directory): `<mirror>/<host>/<path>`, the layout `wget -x` writes
    (the query is dropped)."""
    parts = urllib.parse.urlsplit(url)
    tail = f"{parts.netloc}{parts.path}"
    if "://" in mirror:
        return f"{mirror.rstrip('/')}/{urllib.parse.quote(tail)}"
    local = os.path.normpath(os.path.join(mirror, urllib.parse.unquote(tail)))
    if os.path.commonpath([os.path.abspath(mirror), os.path.abspath(local)]) != os.path.abspath(mirror):
        raise DownloadError(f"{url}: its path leaves the mirror directory {mirror}", key="ELMO_TF_MIRROR")
    return local


class _Retry(Exception):
    """A try that failed in a way worth trying again (5xx, a dropped or stalled connection)."""


def _progress(total, initial, what, quiet):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=what,
        disable=quiet,
        leave=False,
        dynamic_ncols=True,
    )


def fetch(url, target, expected=None, *, what=None, quiet=True, timeout=60.0, retries=5, backoff=1.0, session=None):
    """Downloads `url` to `target` (see the module's docstring); returns `{"size", "sha256", "etag", "url"}`.

    Args:
        url: http(s) URL, or the path of a local file (a mirror directory's copy).
        target: the final path; its directory must exist.
        expected: an `Expected` (size, digests), or None.
        what: how messages name the file (default: `target`'s name).
        quiet: no progress bar (else tqdm's on stderr, with size and ETA).
        timeout: seconds to connect and between two reads before a try counts as stalled.
        retries: failed tries in a row (without a byte received) before giving up.
        backoff: seconds before the first retry; doubled each time, at most 30.
        session: a `requests.Session` (one is made per call otherwise).
    Raises:
        DownloadError: a 4xx answer, retries used up, a wrong size or checksum; the partial file is kept only where
            the next call can resume it (a dropped connection), never when it was refused.
    """
    expected = expected or Expected()
    what = what or os.path.basename(target)
    if "://" not in url:
        return _copy_local(url, target, expected, what)
    import requests

    partial, state_path = partial_paths(target)
    state = _read_state(state_path, url) if os.path.exists(partial) else None
    if state is None:
        discard_partial(target)
    own_session = session is None
    session = session or requests.Session()
    failures = 0
    try:
        while True:
            offset = os.path.getsize(partial) if state is not None else 0
            before = offset
            try:
                state = _one_try(session, url, target, expected, what, state, offset, quiet, timeout)
                break
            except _Retry as e:
                reason = str(e)
            except (requests.Timeout, requests.exceptions.ConnectionError) as e:
                reason = f"no data for {timeout:g} s" if "timed out" in str(e).lower() else f"connection failed: {e}"
            except requests.exceptions.ChunkedEncodingError:
                reason = "the connection broke mid-file"
            state = _read_state(state_path, url) if os.path.exists(partial) else None
            received = (os.path.getsize(partial) if os.path.exists(partial) else 0) > before
            failures = 0 if received else failures + 1
            if failures > retries:
                raise DownloadError(
                    f"{what}: {url}: gave up after {failures} tries in a row without data ({reason}); what arrived "
                    "is kept, and the next try resumes it",
                    path=target,
                )
            delay = min(backoff * 2 ** max(failures - 1, 0), 30.0) if failures else 0.0
            logger.warning("%s: %s; %s", what, reason, f"retrying in {delay:g} s" if delay else "resuming")
            time.sleep(delay)
    finally:
        if own_session:
            session.close()
    try:
        record = verify(partial, expected, f"{what} from {url}")
    except DownloadError:
        discard_partial(target)
        raise
    os.replace(partial, target)
    with contextlib.suppress(FileNotFoundError):
        os.remove(state_path)
    return {**record, "etag": state.get("etag"), "url": url}


def _read_state(path, url):
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("url") == url else None


def _content_range_start(response):
    """The first byte of a 206's Content-Range (`bytes START-END/TOTAL`), and TOTAL (None when `*`)."""
    value = response.headers.get("Content-Range", "")
    try:
        unit, _, spec = value.partition(" ")
        span, _, total = spec.partition("/")
        return int(span.split("-")[0]), (None if total == "*" else int(total))
    except ValueError:
        return None, None


def _one_try(session, url, target, expected, what, state, offset, quiet, timeout):
    """One GET (from `offset` when resuming `state`); returns the state of a complete partial file."""
    partial, state_path = partial_paths(target)
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        validator = state.get("etag") or state.get("last_modified")
        if validator:
            headers["If-Range"] = validator
    with session.get(url, headers=headers, stream=True, timeout=timeout, allow_redirects=True) as response:
        status = response.status_code
        if status in RETRY_STATUS:
            raise _Retry(f"HTTP {status} {response.reason}")
        if status == 416 and offset:
            logger.warning("%s: the server refuses to resume at byte %d; starting over", what, offset)
            discard_partial(target)
            raise _Retry("HTTP 416: starting over")
        if status >= 400:
            hint = {
                403: "the URL is refused (moved, expired or private): check the model's page for a new link",
                404: "the file is not at this URL any more: check the model's page for a new link",
                401: "the server asks for credentials",
            }.get(status, "the server refused the request")
            raise DownloadError(f"{what}: {url}: HTTP {status} {response.reason}: {hint}", path=target)
        etag = response.headers.get("ETag")
        modified = response.headers.get("Last-Modified")
        mode = "wb"
        if offset and status == 206:
            start, total = _content_range_start(response)
            if start != offset or (state.get("etag") and etag and etag != state["etag"]):
                logger.warning("%s: the file changed upstream (ETag or range differs); starting over", what)
                discard_partial(target)
                raise _Retry("changed upstream: starting over")
            mode = "ab"
        else:
            if offset:
                logger.warning(
                    "%s: the server sent the whole file instead of resuming at byte %d (no range support, or the "
                    "file changed upstream); starting over",
                    what,
                    offset,
                )
            offset = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            state = {"url": url, "etag": etag, "last_modified": modified, "total": total}
            write_json(state_path, state)
        total = state.get("total")
        if expected.size is not None and total is not None and total != expected.size:
            discard_partial(target)
            raise DownloadError(
                f"{what}: {url}: the server announces {total} bytes, expected {expected.size}: refused, nothing cached",
                path=target,
            )
        limit = expected.size if expected.size is not None else total
        with open(partial, mode) as f, _progress(total, offset, what, quiet) as bar:
            written = offset
            for chunk in response.iter_content(NET_CHUNK):
                written += len(chunk)
                if limit is not None and written > limit:
                    f.close()
                    discard_partial(target)
                    raise DownloadError(
                        f"{what}: {url}: more than the {limit} bytes expected: refused, nothing cached", path=target
                    )
                f.write(chunk)
                bar.update(len(chunk))
        if total is not None and written < total:
            raise _Retry(f"the connection closed at byte {written} of {total}")
    return state


def _copy_local(path, target, expected, what):
    if not os.path.isfile(path):
        raise DownloadError(f"{what}: {path}: no such file in the mirror directory", key="ELMO_TF_MIRROR", path=path)
    partial, _ = partial_paths(target)
    discard_partial(target)
    try:
        shutil.copyfile(path, partial)
        record = verify(partial, expected, f"{what} from {path}")
    except BaseException:
        discard_partial(target)
        raise
    os.replace(partial, target)
    return {**record, "etag": None, "url": path}
