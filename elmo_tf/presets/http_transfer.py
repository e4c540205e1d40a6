"""One HTTP try of a download: the GET with its redirects, the Range / If-Range resume and the checks of the
server's validators, the body written to the partial file within its bound.

`one_try` sends one GET (a `Range` from the bytes on disk, with `If-Range` when the partial file's ETag is strong),
follows at most `MAX_REDIRECTS` redirects by hand (each to http(s), never from https to http), and then:
- a 206 whose Content-Range, ETag, Last-Modified or total differs from the partial file's state: the file changed
  upstream, the bytes are thrown away and the try is retried (`Retry`);
- a 200 to a request for the rest: the server sent the whole file, which replaces the partial one (with a warning);
- 5xx and 429, a 416 to a resume, a body cut short, a try past its deadline: `Retry`; other 4xx: `DownloadError`;
- a body longer than its bound (the published size, else Content-Length, else the ceiling) is refused, nothing kept.
The retry loop around it, with its bounds on tries and time, is `elmo_tf.presets.download.fetch`'s.
"""

import contextlib
import logging
import os
import time
import urllib.parse

from elmo_tf.errors import ElmoTFError
from elmo_tf.presets.file_checks import MAX_DOWNLOAD_ENV, NETWORK_HINT, DownloadError, short
from elmo_tf.presets.partial_file import (
    discard_partial,
    partial_paths,
    save_state,
    size_of,
    strong_etag,
    write_all,
    write_failed,
)

# one logger for all of a download's warnings, whichever module of it writes them
logger = logging.getLogger("elmo_tf.presets.download")

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10  # requests' default is 30; tfhub.dev -> Kaggle -> storage is 2 hops
NET_CHUNK = 1 << 16  # what a broken connection can lose: bytes are on disk once a read of this size returns
CLIENT_ERROR_HINTS = {
    403: "the URL is refused (moved, expired or private): check the model's page for a new link",
    404: "the file is not at this URL any more: check the model's page for a new link",
    401: "the server asks for credentials",
}


class Retry(ElmoTFError):
    """A try that failed in a way worth trying again (5xx, a dropped or stalled connection, bytes thrown away).
    Control flow of `elmo_tf.presets.download.fetch`: every one is caught there, and what ends a download is a
    `DownloadError`. Under the one error base like every exception of the library (no `except ValueError` lies
    between a raise and `fetch`'s `except Retry`)."""


def http_errors():
    """The HTTP errors that `requests` may let through unwrapped (urllib3's and http.client's own)."""
    import http.client

    import urllib3

    return (urllib3.exceptions.HTTPError, http.client.HTTPException)


def check_url(url, what):
    """`DownloadError` unless `url` is an http(s) URL."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError as e:
        raise DownloadError(f"{what}: {short(url)}: not a usable URL ({e}); {NETWORK_HINT}") from None
    if scheme not in ("http", "https"):
        raise DownloadError(f"{what}: {short(url)}: only http(s) URLs are downloaded; {NETWORK_HINT}")


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
            f"{what}: {url}: redirected to {short(location)!r}, not a usable URL: refused; {NETWORK_HINT}"
        ) from None
    if scheme not in ("http", "https"):
        raise DownloadError(
            f"{what}: {url}: redirected to {short(hop)!r}: refused (only http(s) redirects are followed); "
            f"{NETWORK_HINT}"
        )
    if urllib.parse.urlsplit(current).scheme.lower() == "https" and scheme == "http":
        raise DownloadError(
            f"{what}: {url}: redirected from https to http ({short(hop)!r}): refused (only http(s) redirects are "
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
                f"{what}: {url}: an answer from {short(current)} that is not usable ({short(e)}; a redirect to a "
                f"malformed URL?): refused; {NETWORK_HINT}"
            ) from None
        if response.status_code not in REDIRECT_STATUS:
            return response
        location = response.headers.get("Location")
        response.close()
        current = _next_hop(current, location, url, what)
    raise DownloadError(f"{what}: {url}: more than {MAX_REDIRECTS} redirects: refused; {NETWORK_HINT}")


def _content_range_start(response):
    """The first byte of a 206's Content-Range (`bytes START-END/TOTAL`), and TOTAL (None when `*`)."""
    value = response.headers.get("Content-Range", "")
    try:
        unit, _, spec = value.partition(" ")
        span, _, total = spec.partition("/")
        return int(span.split("-")[0]), (None if total == "*" else int(total))
    except ValueError:
        return None, None


def _request_headers(offset, state):
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if strong_etag(state.get("etag")):  # else a published SHA-256 checks the whole file once it is there
            headers["If-Range"] = state["etag"]
    return headers


def _check_status(response, offset, url, target, what):
    """`Retry` for a status worth trying again (5xx, 429, a 416 to a resume), `DownloadError` for another 4xx."""
    status = response.status_code
    if status in RETRY_STATUS:
        raise Retry(f"HTTP {status} {response.reason}")
    if status == 416 and offset:
        logger.warning("%s: the server refuses to resume at byte %d; starting over", what, offset)
        discard_partial(target)
        raise Retry("HTTP 416: starting over")
    if status >= 400:
        hint = CLIENT_ERROR_HINTS.get(status, "the server refused the request")
        raise DownloadError(f"{what}: {url}: HTTP {status} {response.reason}: {hint}", path=target)


def _resumed_state(response, offset, state, url, target, what):
    """The partial file's state once a 206 continues it, or `Retry` (the bytes thrown away) when its range, total,
    ETag or Last-Modified says the file changed upstream."""
    start, total = _content_range_start(response)
    changed = start != offset or (state.get("total") is not None and total != state["total"])
    changed = changed or any(
        state.get(key) and value and value != state[key]
        for key, value in (
            ("etag", response.headers.get("ETag")),
            ("last_modified", response.headers.get("Last-Modified")),
        )
    )
    if changed:
        logger.warning("%s: the file changed upstream (ETag or range differs); starting over", what)
        discard_partial(target)
        raise Retry("changed upstream: starting over")
    if not state.get("resumed"):
        state = {**state, "resumed": True}
        save_state(partial_paths(target)[1], state, what, url, target)
    return state


def _fresh_state(response, offset, expected, ceiling, url, target, what):
    """The state of a new partial file for a 200 (the whole file; a server that would not resume at `offset` is
    warned of), saved once the old one is discarded; `DownloadError` when a file of unknown size announces more
    than `ceiling`."""
    if offset:
        logger.warning(
            "%s: the server sent the whole file instead of resuming at byte %d (no range support, or the "
            "file changed upstream); starting over",
            what,
            offset,
        )
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
    headers = response.headers
    state = {"url": url, "etag": headers.get("ETag"), "last_modified": headers.get("Last-Modified"), "total": total}
    discard_partial(target)
    save_state(partial_paths(target)[1], state, what, url, target)
    return state


def _body_bound(expected, total, ceiling, url, target, what):
    """`(limit, over)`: the most bytes the file may have (the published size, else the announced total, else the
    ceiling) and what a longer body is, for its refusal; `DownloadError` when the two sizes disagree."""
    if expected.size is not None and total is not None and total != expected.size:
        discard_partial(target)
        raise DownloadError(
            f"{what}: {url}: the server announces {total} bytes, expected {expected.size}: refused, nothing cached",
            path=target,
        )
    if expected.size is not None:
        return expected.size, f"more than the {expected.size} bytes expected"
    if total is not None:
        return total, f"a body longer than its Content-Length of {total}"
    return ceiling, (
        f"more than {MAX_DOWNLOAD_ENV}={ceiling} bytes, the ceiling for a file of unknown size (set it "
        "higher if the file is that large)"
    )


def one_try(session, url, target, expected, what, state, offset, quiet, timeout, ceiling, stop_at):
    """One GET (from `offset` when resuming `state`); returns the state of a complete partial file.

    `stop_at` (`time.monotonic()`) ends a try still running then (`Retry`); `ceiling` bounds a file of unknown size.
    """
    partial, _ = partial_paths(target)
    with _get(session, url, _request_headers(offset, state), timeout, what) as response:
        _check_status(response, offset, url, target, what)
        status = response.status_code
        if offset and status == 206:
            state, append = _resumed_state(response, offset, state, url, target, what), True
        elif status != 200:
            raise DownloadError(
                f"{what}: {url}: HTTP {status} {response.reason} to a request for "
                f"{'the rest' if offset else 'the whole'} of the file: refused; {NETWORK_HINT}",
                path=target,
            )
        else:
            state, append = _fresh_state(response, offset, expected, ceiling, url, target, what), False
            offset = 0
        total = state.get("total")
        limit, over = _body_bound(expected, total, ceiling, url, target, what)
        _receive(response, partial, append, offset, total, limit, over, stop_at, quiet, what, url, target)
        written = size_of(partial)
        if total is not None and written < total:
            raise Retry(f"the connection closed at byte {written} of {total}")
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


def _receive(response, partial, append, offset, total, limit, over, stop_at, quiet, what, url, target):
    """Writes `response`'s body to `partial` (after its first `offset` bytes when `append`), at most `limit` bytes in
    all (`over`: what a longer body is, for the refusal), until `stop_at` (`time.monotonic()`)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(partial, flags, 0o644)
    except OSError as e:
        raise write_failed(what, url, partial, e, target) from None
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
                    write_all(fd, chunk)
                except OSError as e:
                    refused = write_failed(what, url, partial, e, target)
                    break
                bar.update(len(chunk))
                if time.monotonic() > stop_at:
                    raise Retry(f"still downloading at byte {written}")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if refused is not None:
        discard_partial(target)
        raise refused
