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
If-Range protocol, the retry loop, the bounds and the verification are written in this package: requests has no
resume, and urllib3's Retry retries a request from its start, not from the bytes already written.

This module holds `fetch` and its retry loop; the rest lives by concern, and its public names are importable here:
    file_checks.py    `Expected`, `verify`, the ceiling for a file of unknown size, `DownloadError`
    partial_file.py   the partial file and its state beside the target, and when it may be resumed
    http_transfer.py  one HTTP try: redirects, Range / If-Range and the validators, the body within its bound
    mirror.py         `mirrored` (a URL's copy under `$ELMO_TF_MIRROR`) and the copy of a mirror directory's file
"""

import contextlib
import logging
import os
import time

from elmo_tf.presets.file_checks import (
    HASHES,
    MAX_DOWNLOAD_BYTES,
    MAX_DOWNLOAD_ENV,
    NETWORK_HINT,
    DownloadError,
    Expected,
    file_digests,
    max_download_bytes,
    short,
    verify,
)
from elmo_tf.presets.http_transfer import MAX_REDIRECTS, Retry, check_url, http_errors, one_try
from elmo_tf.presets.mirror import copy_local, mirrored
from elmo_tf.presets.partial_file import (
    discard_partial,
    partial_paths,
    resumable,
    size_of,
    strong_etag,
    usable_partial,
    write_failed,
)

__all__ = [
    "DEADLINE",
    "HASHES",
    "MAX_DOWNLOAD_BYTES",
    "MAX_DOWNLOAD_ENV",
    "MAX_REDIRECTS",
    "MAX_TRIES",
    "NETWORK_HINT",
    "DownloadError",
    "Expected",
    "discard_partial",
    "fetch",
    "file_digests",
    "max_download_bytes",
    "mirrored",
    "partial_paths",
    "strong_etag",
    "verify",
]

logger = logging.getLogger(__name__)

MAX_TRIES = 100  # tries in all for one file, even tries that each bring bytes (a server that trickles and cuts)
DEADLINE = 24 * 3600.0  # seconds in all for one file: 1.6 GB at 20 KB/s; a server that trickles forever ends


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
            next call can resume it (`partial_file.resume_proof`), never when it was refused.
    """
    expected = expected or Expected()
    what = what or os.path.basename(target)
    ceiling = max_download_bytes()
    if "://" not in url:
        return copy_local(url, target, expected, what, ceiling)
    check_url(url, what)
    import requests

    own_session = session is None
    session = session or requests.Session()
    bounds = {"retries": retries, "backoff": backoff, "max_tries": max_tries, "deadline": deadline}
    try:
        state, record = _tries(session, url, target, expected, what, quiet, timeout, ceiling, bounds)
    finally:
        if own_session:
            session.close()
    partial, state_path = partial_paths(target)
    try:
        os.replace(partial, target)
    except OSError as e:
        raise write_failed(what, url, target, e, target) from None
    with contextlib.suppress(FileNotFoundError):
        os.remove(state_path)
    return {**record, "etag": state.get("etag"), "url": url}


def _tries(session, url, target, expected, what, quiet, timeout, ceiling, bounds):
    """`fetch`'s tries until the partial file is whole and verified: `(its state, verify's record)`. A try that
    fails worth retrying waits its backoff; `_give_up`'s `DownloadError` once a try fails for good or `bounds`
    (retries, backoff, max_tries, deadline: `fetch`'s arguments) are used up."""
    import requests

    partial, _ = partial_paths(target)
    state = usable_partial(target, url, expected, what)
    kept = size_of(partial) if state is not None else 0  # the most the final file has held: net progress passes it
    started = time.monotonic()
    stop_at = started + bounds["deadline"]
    tries = failures = 0
    while True:
        tries += 1
        offset = size_of(partial) if state is not None else 0
        try:
            state = one_try(session, url, target, expected, what, state, offset, quiet, timeout, ceiling, stop_at)
            return state, _verified(partial, expected, what, url, state, target)
        except Retry as e:
            reason = str(e)
        except (requests.Timeout, requests.exceptions.ConnectionError) as e:
            timed_out = "timed out" in str(e).lower()
            reason = f"no data for {timeout:g} s" if timed_out else f"connection failed: {short(e)}"
        except requests.exceptions.ChunkedEncodingError:
            reason = "the connection broke mid-file"
        except (requests.exceptions.RequestException, *http_errors()) as e:
            raise _give_up(f"{what}: {url}: {type(e).__name__}: {short(e)}", target, url, expected) from None
        state = usable_partial(target, url, expected, what)
        size = size_of(partial) if state is not None else 0
        if size > kept:
            kept, failures = size, 0
        else:
            failures += 1
        elapsed = time.monotonic() - started
        message = _bound_reached(failures, tries, elapsed, bounds, reason)
        if message is not None:
            raise _give_up(f"{what}: {url}: {message}", target, url, expected)
        delay = (
            min(bounds["backoff"] * 2 ** max(failures - 1, 0), 30.0, bounds["deadline"] - elapsed) if failures else 0.0
        )
        logger.warning("%s: %s; %s", what, reason, f"retrying in {delay:g} s" if delay else "resuming")
        time.sleep(delay)


def _bound_reached(failures, tries, elapsed, bounds, reason):
    """Why `fetch` gives up after a failed try (`reason`), or None while its bounds leave room for another."""
    if failures > bounds["retries"]:
        return f"gave up after {failures} tries in a row without the file growing ({reason})"
    if tries >= bounds["max_tries"]:
        return f"gave up after {tries} tries, the most for one file ({reason})"
    if elapsed >= bounds["deadline"]:
        return f"gave up after {bounds['deadline']:g} s, the most for one file ({reason})"
    return None


def _give_up(message, target, url, expected):
    """The `DownloadError` that ends `fetch`: the partial file kept when the next call can resume it, else removed;
    the message says which, and what to do."""
    if resumable(target, url, expected):
        kept = "what arrived is kept, and the next call resumes it"
    else:
        discard_partial(target)
        kept = "nothing is kept"
    return DownloadError(f"{message}; {kept}; {NETWORK_HINT}", path=target)


def _verified(partial, expected, what, url, state, target):
    """`verify` of the complete partial file; a file that does not verify is removed, and when it was resumed (its
    head from another response than its tail) the download starts over (`Retry`) instead of failing."""
    try:
        return verify(partial, expected, f"{what} from {url}")
    except DownloadError:
        discard_partial(target)
        if state.get("resumed"):
            logger.warning("%s: the resumed file does not match its checksum; starting over", what)
            raise Retry("the resumed file did not match its checksum: starting over") from None
        raise
