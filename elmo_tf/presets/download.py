"""One file from a URL (or a mirror directory) to a path: resumed, retried, bounded, verified, and only then in place.

`fetch(url, target, expected)` writes `.<name>.partial` beside `target` and, beside that, `.<name>.partial.json`
(the URL, the server's ETag and Last-Modified, the total size). The final name appears only once the whole file is
there and matches `expected` (size, SHA-256 / MD5 / SHA-1 where known): a reader never sees part of a file, and a
file that does not match is deleted, never cached. What `keras.utils.get_file` and allennlp's `cached_path` do not:
- an interrupted download (a dropped connection, a stalled server, kill -9, Ctrl-C) resumes from the bytes on disk
  with an HTTP Range request only when those bytes can be proven to be of the same file, as huggingface_hub's
  `file_download.py` does: a strong ETag (sent as `If-Range`, and the 206 must carry the same one) or a published
  SHA-256 (checked once the file is whole; a resumed file that fails it starts over once). A weak ETag
  (`W/"..."`), a Last-Modified date (one-second resolution) or no validator at all: the partial file is discarded
  and the download starts over. A 200 instead of a 206, or a 206 under another ETag, Last-Modified or range, starts
  over, with a warning;
- 5xx, 429, dropped connections and stalls (no byte for `timeout` seconds) are retried with exponential backoff.
  Progress is net progress of the final file: a try counts as one only when the partial file grows past the most
  it ever held in this call, so bytes thrown away (a resume refused, a file changed upstream) never reset the count
  of `retries` failed tries in a row. Each file also has a bound on its tries in all (`max_tries`, default
  `MAX_TRIES`) and on its time in all (`deadline`, default `DEADLINE`, checked between reads too);
- sizes are bounded before they are written: a published size bounds the body; without one, the server's
  Content-Length (refused before reading when it is over the ceiling) and the ceiling `MAX_DOWNLOAD_BYTES`
  (`$ELMO_TF_MAX_DOWNLOAD_BYTES`) bound it; a body longer than its bound is refused, nothing kept;
- redirects are followed by hand, at most `MAX_REDIRECTS`, each hop to http(s) only and never from https to http;
- 4xx (403, 404, ...), a wrong size or checksum, a refused redirect, any other `requests` error, tries or time used
  up: one-line `DownloadError`s naming the file, the URL and what to do;
- a write error (a full disk: ENOSPC, a file-size limit: EFBIG, a quota: EDQUOT, a read-only file system: EROFS)
  is a one-line `DownloadError`, with the partial file removed (it would hold the space that the user has to free;
  the next call starts over) and nothing under the final name;
- a mirror directory's file (`mirrored`) must resolve (links followed) inside the mirror directory and be a regular
  file: a link out of it, a FIFO, a device or a directory is refused.
Callers serialize downloads of one target with a lock (`elmo_tf.presets.cache`); `fetch` itself takes none.
requests does the HTTP (chunked bodies, a truncated body detected from Content-Length); redirects, the Range and
If-Range protocol, the retry loop, the bounds and the verification are written here: requests has no resume, and
urllib3's Retry retries a request from its start, not from the bytes already written.
"""

import contextlib
import hashlib
import json
import logging
import os
import stat
import time
import urllib.parse

from elmo_tf.errors import ElmoTFError, not_a_regular_file, one_line
from elmo_tf.io.atomic import write_json

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
CHUNK = 1 << 20  # hashing
NET_CHUNK = 1 << 16  # what a broken connection can lose: bytes are on disk once a read of this size returns
HASHES = ("sha256", "md5", "sha1")
REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10  # requests' default is 30; tfhub.dev -> Kaggle -> storage is 2 hops
MAX_DOWNLOAD_ENV = "ELMO_TF_MAX_DOWNLOAD_BYTES"
# The ceiling on a file whose size no one publishes. The largest released ELMo file is the original model's softmax
# (about 1.6 GB; its weights about 360 MB, the TF Hub tarball about 350 MB): 4 GiB leaves room and still stops a
# server without end before it fills a disk.
MAX_DOWNLOAD_BYTES = 4 << 30
MAX_TRIES = 100  # tries in all for one file, even tries that each bring bytes (a server that trickles and cuts)
DEADLINE = 24 * 3600.0  # seconds in all for one file: 1.6 GB at 20 KB/s; a server that trickles forever ends
NETWORK_HINT = (
    "check the URL and the network, or set ELMO_TF_MIRROR to a copy of the files (ELMO_TF_OFFLINE=1 uses the cache "
    "only)"
)


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
    (the query is dropped). A directory's file must lie inside it once links are resolved (`os.path.realpath`):
    `DownloadError` otherwise."""
    parts = urllib.parse.urlsplit(url)
    tail = f"{parts.netloc}{parts.path}"
    if "://" in mirror:
        return f"{mirror.rstrip('/')}/{urllib.parse.quote(tail)}"
    local = os.path.normpath(os.path.join(mirror, urllib.parse.unquote(tail)))
    if os.path.commonpath([os.path.abspath(mirror), os.path.abspath(local)]) != os.path.abspath(mirror):
        raise DownloadError(f"{url}: its path leaves the mirror directory {mirror}", key="ELMO_TF_MIRROR")
    root, real = os.path.realpath(mirror), os.path.realpath(local)
    if os.path.commonpath([root, real]) != root:
        raise DownloadError(
            f"{url}: {local} leaves the mirror directory {mirror} (a link to {real}): refused",
            key="ELMO_TF_MIRROR",
            path=local,
        )
    return local


class _Retry(ElmoTFError):
    """A try that failed in a way worth trying again (5xx, a dropped or stalled connection, bytes thrown away).
    Private control flow of `fetch`: every one is caught there, and what ends a download is a `DownloadError`. Under
    the one error base like every exception of the library (no `except ValueError` lies between a raise and `fetch`'s
    `except _Retry`)."""


def max_download_bytes():
    """The ceiling on a file whose size no one publishes: `$ELMO_TF_MAX_DOWNLOAD_BYTES`, else `MAX_DOWNLOAD_BYTES`;
    `DownloadError` (one line naming the variable and its value) when it is not a positive integer."""
    text = os.environ.get(MAX_DOWNLOAD_ENV)
    if text is None or not text.strip():
        return MAX_DOWNLOAD_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise DownloadError(
            f"{MAX_DOWNLOAD_ENV} must be a positive integer (bytes), got {text!r}", key=MAX_DOWNLOAD_ENV
        )
    return value


def strong_etag(etag):
    """Whether `etag` is a strong entity tag (RFC 9110 8.8.3): present and not `W/"..."`. Only a strong tag says two
    responses are the same bytes, so only a strong tag may join the bytes of two responses (`If-Range`)."""
    return bool(etag) and not etag.strip()[:2].upper() == "W/"


def _resume_proof(state, expected):
    """How the bytes of a partial file can be proven to belong to the file its resume completes: "etag" (a strong
    ETag, sent as If-Range: the server sends the rest only if the file is still that one), "sha256" (a published
    checksum, checked once the file is whole; a spliced file is refused there), or None: then no resume. A
    Last-Modified date is not proof: it has a resolution of one second and a file changed twice within one second
    keeps it (RFC 9110 13.1.5 allows it in If-Range only under conditions a client cannot check)."""
    if strong_etag(state.get("etag")):
        return "etag"
    if expected.sha256:
        return "sha256"
    return None


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _usable_partial(target, url, expected, what):
    """The state of `target`'s partial file when a resume of it can be proven right (`_resume_proof`); otherwise the
    partial file is discarded (with a warning when it held bytes) and None is returned."""
    partial, state_path = partial_paths(target)
    state = _read_state(state_path, url) if os.path.exists(partial) else None
    if state is not None and not _resume_proof(state, expected):
        size = _size(partial)
        if size:
            logger.warning(
                "%s: the %d bytes of an earlier try cannot be proven to be of the same file (the server sent no strong "
                "ETag and no SHA-256 is published); starting over",
                what,
                size,
            )
        state = None
    if state is None:
        discard_partial(target)
    return state


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


def _short(text, limit=200):
    text = one_line(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _write_failed(what, url, path, error, target):
    """The `DownloadError` of a write that failed (a full disk, a file-size limit, a quota, a read-only file system),
    once the partial file is removed: nothing of the file is left."""
    discard_partial(target)
    reason = error.strerror or one_line(error)
    return DownloadError(
        f"{what}: {url}: cannot write {path}: {reason}: nothing cached (free space there, or set ELMO_TF_HOME to a "
        "cache on another disk)",
        path=path,
    )


def fetch(
    url,
    target,
    expected=None,
    *,
    what=None,
    quiet=True,
    timeout=60.0,
    retries=5,
    backoff=1.0,
    session=None,
    max_tries=MAX_TRIES,
    deadline=DEADLINE,
):
    """Downloads `url` to `target` (see the module's docstring); returns `{"size", "sha256", "etag", "url"}`.

    Args:
        url: http(s) URL, or the path of a local file (a mirror directory's copy, from `mirrored`).
        target: the final path; its directory must exist.
        expected: an `Expected` (size, digests), or None.
        what: how messages name the file (default: `target`'s name).
        quiet: no progress bar (else tqdm's on stderr, with size and ETA).
        timeout: seconds to connect and between two reads before a try counts as stalled.
        retries: failed tries in a row without net progress (the partial file growing past the most it ever held
            in this call) before giving up.
        backoff: seconds before the first retry; doubled each time, at most 30.
        session: a `requests.Session` (one is made per call otherwise).
        max_tries: tries in all for this file, whatever they brought.
        deadline: seconds in all for this file; a try still running then is stopped.
    Raises:
        DownloadError: a 4xx answer, a redirect to another scheme, any other `requests` error, tries or time used up,
            a body over its bound, a write error, a wrong size or checksum; the partial file is kept only where the
            next call can resume it (`_resume_proof`), never when it was refused.
    """
    expected = expected or Expected()
    what = what or os.path.basename(target)
    ceiling = max_download_bytes()
    if "://" not in url:
        return _copy_local(url, target, expected, what, ceiling)
    _check_url(url, what)
    import requests

    partial, state_path = partial_paths(target)
    state = _usable_partial(target, url, expected, what)
    kept = _size(partial) if state is not None else 0  # the most the final file has held: net progress passes it
    own_session = session is None
    session = session or requests.Session()
    started = time.monotonic()
    tries = failures = 0
    try:
        while True:
            tries += 1
            offset = _size(partial) if state is not None else 0
            try:
                state = _one_try(
                    session, url, target, expected, what, state, offset, quiet, timeout, ceiling, started + deadline
                )
                record = _verified(partial, expected, what, url, state, target)
                break
            except _Retry as e:
                reason = str(e)
            except (requests.Timeout, requests.exceptions.ConnectionError) as e:
                timed_out = "timed out" in str(e).lower()
                reason = f"no data for {timeout:g} s" if timed_out else f"connection failed: {_short(e)}"
            except requests.exceptions.ChunkedEncodingError:
                reason = "the connection broke mid-file"
            except (requests.exceptions.RequestException, *_http_errors()) as e:
                raise _give_up(f"{what}: {url}: {type(e).__name__}: {_short(e)}", target, url, expected) from None
            state = _usable_partial(target, url, expected, what)
            size = _size(partial) if state is not None else 0
            if size > kept:
                kept, failures = size, 0
            else:
                failures += 1
            elapsed = time.monotonic() - started
            if failures > retries:
                message = f"gave up after {failures} tries in a row without the file growing ({reason})"
            elif tries >= max_tries:
                message = f"gave up after {tries} tries, the most for one file ({reason})"
            elif elapsed >= deadline:
                message = f"gave up after {deadline:g} s, the most for one file ({reason})"
            else:
                delay = min(backoff * 2 ** max(failures - 1, 0), 30.0, deadline - elapsed) if failures else 0.0
                logger.warning("%s: %s; %s", what, reason, f"retrying in {delay:g} s" if delay else "resuming")
                time.sleep(delay)
                continue
            raise _give_up(f"{what}: {url}: {message}", target, url, expected)
    finally:
        if own_session:
            session.close()
    try:
        os.replace(partial, target)
    except OSError as e:
        raise _write_failed(what, url, target, e, target) from None
    with contextlib.suppress(FileNotFoundError):
        os.remove(state_path)
    return {**record, "etag": state.get("etag"), "url": url}


def _http_errors():
    """The HTTP errors that `requests` may let through unwrapped (urllib3's and http.client's own)."""
    import http.client

    import urllib3

    return (urllib3.exceptions.HTTPError, http.client.HTTPException)


def _give_up(message, target, url, expected):
    """The `DownloadError` that ends `fetch`: the partial file kept when the next call can resume it, else removed;
    the message says which, and what to do."""
    partial, state_path = partial_paths(target)
    state = _read_state(state_path, url) if os.path.exists(partial) else None
    if state is not None and _resume_proof(state, expected) and _size(partial):
        kept = "what arrived is kept, and the next call resumes it"
    else:
        discard_partial(target)
        kept = "nothing is kept"
    return DownloadError(f"{message}; {kept}; {NETWORK_HINT}", path=target)


def _verified(partial, expected, what, url, state, target):
    """`verify` of the complete partial file; a file that does not verify is removed, and when it was resumed (its
    head from another response than its tail) the download starts over (`_Retry`) instead of failing."""
    try:
        return verify(partial, expected, f"{what} from {url}")
    except DownloadError:
        discard_partial(target)
        if state.get("resumed"):
            logger.warning("%s: the resumed file does not match its checksum; starting over", what)
            raise _Retry("the resumed file did not match its checksum: starting over") from None
        raise


def _check_url(url, what):
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError as e:
        raise DownloadError(f"{what}: {_short(url)}: not a usable URL ({e}); {NETWORK_HINT}") from None
    if scheme not in ("http", "https"):
        raise DownloadError(f"{what}: {_short(url)}: only http(s) URLs are downloaded; {NETWORK_HINT}")


def _next_hop(current, location, url, what):
    """The URL a redirect from `current` to `location` leads to, or `DownloadError` when it leaves http(s) or goes
    from https to http (`url`: the first URL, for the message)."""
    if not location:
        raise DownloadError(f"{what}: {url}: a redirect without a Location: refused; {NETWORK_HINT}")
    try:
        hop = urllib.parse.urljoin(current, location.strip())
        scheme = urllib.parse.urlsplit(hop).scheme.lower()
    except ValueError:
        raise DownloadError(
            f"{what}: {url}: redirected to {_short(location)!r}, not a usable URL: refused; {NETWORK_HINT}"
        ) from None
    if scheme not in ("http", "https"):
        raise DownloadError(
            f"{what}: {url}: redirected to {_short(hop)!r}: refused (only http(s) redirects are followed); "
            f"{NETWORK_HINT}"
        )
    if urllib.parse.urlsplit(current).scheme.lower() == "https" and scheme == "http":
        raise DownloadError(
            f"{what}: {url}: redirected from https to http ({_short(hop)!r}): refused (only http(s) redirects are "
            f"followed, never from https to http); {NETWORK_HINT}"
        )
    return hop


def _get(session, url, headers, timeout, what):
    """GET `url` (streamed), following at most `MAX_REDIRECTS` redirects, each checked by `_next_hop`."""
    import requests

    current = url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            response = session.get(current, headers=headers, stream=True, timeout=timeout, allow_redirects=False)
        except requests.exceptions.RequestException:
            raise
        except ValueError as e:  # requests parses a redirect's Location (`response.next`) even when not following it
            raise DownloadError(
                f"{what}: {url}: an answer from {_short(current)} that is not usable ({_short(e)}; a redirect to a "
                f"malformed URL?): refused; {NETWORK_HINT}"
            ) from None
        if response.status_code not in REDIRECT_STATUS:
            return response
        location = response.headers.get("Location")
        response.close()
        current = _next_hop(current, location, url, what)
    raise DownloadError(f"{what}: {url}: more than {MAX_REDIRECTS} redirects: refused; {NETWORK_HINT}")


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


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _one_try(session, url, target, expected, what, state, offset, quiet, timeout, ceiling, stop_at):
    """One GET (from `offset` when resuming `state`); returns the state of a complete partial file."""
    partial, state_path = partial_paths(target)
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if strong_etag(state.get("etag")):  # else a published SHA-256 checks the whole file once it is there
            headers["If-Range"] = state["etag"]
    with _get(session, url, headers, timeout, what) as response:
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
        append = False
        if offset and status == 206:
            start, total = _content_range_start(response)
            changed = start != offset or (state.get("total") is not None and total != state["total"])
            changed = changed or any(
                state.get(key) and value and value != state[key]
                for key, value in (("etag", etag), ("last_modified", modified))
            )
            if changed:
                logger.warning("%s: the file changed upstream (ETag or range differs); starting over", what)
                discard_partial(target)
                raise _Retry("changed upstream: starting over")
            append = True
            if not state.get("resumed"):
                state = {**state, "resumed": True}
                _save_state(state_path, state, what, url, target)
        elif status != 200:
            raise DownloadError(
                f"{what}: {url}: HTTP {status} {response.reason} to a request for "
                f"{'the rest' if offset else 'the whole'} of the file: refused; {NETWORK_HINT}",
                path=target,
            )
        else:
            if offset:
                logger.warning(
                    "%s: the server sent the whole file instead of resuming at byte %d (no range support, or the "
                    "file changed upstream); starting over",
                    what,
                    offset,
                )
            offset = 0
            length = response.headers.get("Content-Length", "").strip()
            total = int(length) if length.isdigit() else None
            if expected.size is None and total is not None and total > ceiling:
                discard_partial(target)
                raise DownloadError(
                    f"{what}: {url}: the server announces {total} bytes, more than {MAX_DOWNLOAD_ENV}={ceiling} (the "
                    f"ceiling for a file of unknown size): refused before reading, nothing cached; set "
                    f"{MAX_DOWNLOAD_ENV} higher if the file is that large",
                    path=target,
                )
            state = {"url": url, "etag": etag, "last_modified": modified, "total": total}
            discard_partial(target)
            _save_state(state_path, state, what, url, target)
        total = state.get("total")
        if expected.size is not None and total is not None and total != expected.size:
            discard_partial(target)
            raise DownloadError(
                f"{what}: {url}: the server announces {total} bytes, expected {expected.size}: refused, nothing cached",
                path=target,
            )
        if expected.size is not None:
            limit, over = expected.size, f"more than the {expected.size} bytes expected"
        elif total is not None:
            limit, over = total, f"a body longer than its Content-Length of {total}"
        else:
            limit = ceiling
            over = (
                f"more than {MAX_DOWNLOAD_ENV}={ceiling} bytes, the ceiling for a file of unknown size (set it "
                "higher if the file is that large)"
            )
        _receive(response, partial, append, offset, total, limit, over, stop_at, quiet, what, url, target)
        written = _size(partial)
        if total is not None and written < total:
            raise _Retry(f"the connection closed at byte {written} of {total}")
    return state


def _save_state(state_path, state, what, url, target):
    try:
        write_json(state_path, state)
    except OSError as e:
        raise _write_failed(what, url, state_path, e, target) from None


def _receive(response, partial, append, offset, total, limit, over, stop_at, quiet, what, url, target):
    """Writes `response`'s body to `partial` (after its first `offset` bytes when `append`), at most `limit` bytes in
    all (`over`: what a longer body is, for the refusal), until `stop_at` (`time.monotonic()`)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(partial, flags, 0o644)
    except OSError as e:
        raise _write_failed(what, url, partial, e, target) from None
    refused = None
    try:
        with _progress(total, offset, what, quiet) as bar:
            written = offset
            for chunk in response.iter_content(NET_CHUNK):
                written += len(chunk)
                if written > limit:
                    refused = DownloadError(f"{what}: {url}: {over}: refused, nothing cached", path=target)
                    break
                try:
                    _write_all(fd, chunk)
                except OSError as e:
                    refused = _write_failed(what, url, partial, e, target)
                    break
                bar.update(len(chunk))
                if time.monotonic() > stop_at:
                    raise _Retry(f"still downloading at byte {written}")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if refused is not None:
        discard_partial(target)
        raise refused


def _copy_fd(source, partial, limit, what, path):
    """Copies the open file `source` (a descriptor; `path` names it) to a new `partial`; returns the bytes copied,
    stopping past `limit` (a file that grows while copied). A read error is a `DownloadError`; a write error is the
    `OSError` itself (the caller's `_write_failed`)."""
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    copied = 0
    try:
        while True:
            try:
                chunk = os.read(source, CHUNK)
            except OSError as e:
                raise DownloadError(
                    f"{what}: {path}: cannot read it in the mirror directory: {e.strerror}", path=path
                ) from None
            if not chunk:
                break
            copied += len(chunk)
            if copied > limit:
                break
            _write_all(fd, chunk)
    finally:
        os.close(fd)
    return copied


def _copy_local(path, target, expected, what, ceiling):
    """Copies a mirror directory's file: a regular file (`mirrored` has checked that it resolves inside the mirror;
    it is opened without following a link in its last component, and without blocking on a FIFO put there since)."""
    kind = not_a_regular_file(path)
    if kind is not None:
        where = "no such file in the mirror directory" if kind == "no such file" else f"{kind}: refused"
        raise DownloadError(f"{what}: {path}: {where}", key="ELMO_TF_MIRROR", path=path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        source = os.open(os.path.realpath(path), flags)
    except OSError as e:
        raise DownloadError(
            f"{what}: {path}: cannot read it in the mirror directory: {e.strerror}", key="ELMO_TF_MIRROR", path=path
        ) from None
    partial, _ = partial_paths(target)
    discard_partial(target)
    try:
        info = os.fstat(source)
        if not stat.S_ISREG(info.st_mode):
            raise DownloadError(f"{what}: {path}: not a regular file: refused", key="ELMO_TF_MIRROR", path=path)
        limit = expected.size if expected.size is not None else ceiling
        if expected.size is None and info.st_size > ceiling:
            raise DownloadError(
                f"{what}: {path}: {info.st_size} bytes, more than {MAX_DOWNLOAD_ENV}={ceiling} (the ceiling for a "
                f"file of unknown size): refused, nothing cached; set {MAX_DOWNLOAD_ENV} higher if the file is that "
                "large",
                key=MAX_DOWNLOAD_ENV,
                path=path,
            )
        try:
            copied = _copy_fd(source, partial, limit, what, path)
        except OSError as e:
            raise _write_failed(what, path, partial, e, target) from None
        if copied > limit:
            raise DownloadError(f"{what}: {path}: grew past {limit} bytes while copied: refused", path=path)
        record = verify(partial, expected, f"{what} from {path}")
        try:
            os.replace(partial, target)
        except OSError as e:
            raise _write_failed(what, path, target, e, target) from None
    except BaseException:
        discard_partial(target)
        raise
    finally:
        os.close(source)
    return {**record, "etag": None, "url": path}
