"""The bytes of a download while they arrive: the partial file beside its target, its state, and when it may resume.

`partial_paths(target)` names `.<name>.partial` and `.<name>.partial.json` beside `target`: the bytes so far, and
the state of the response they came from (the URL, the server's ETag and Last-Modified, the total size; "resumed"
once a second response has added to them). A later call resumes the partial file only when its bytes can be proven
to belong to the file it completes (`resume_proof`, as huggingface_hub's `file_download.py` decides): a strong ETag
(sent as `If-Range`) or a published SHA-256 (checked once the file is whole). Anything else is discarded
(`usable_partial`). A write that fails (a full disk, a quota, a read-only file system) removes both files
(`write_failed`): they would hold the space the user has to free.
"""

import contextlib
import json
import logging
import os

from elmo_tf.errors import one_line
from elmo_tf.io.atomic import write_json
from elmo_tf.presets.file_checks import DownloadError

# one logger for all of a download's warnings, whichever module of it writes them
logger = logging.getLogger("elmo_tf.presets.download")


def partial_paths(target):
    """`(partial file, its state JSON)` of `target`: hidden names beside it."""
    directory, name = os.path.split(os.path.abspath(target))
    partial = os.path.join(directory, f".{name}.partial")
    return partial, partial + ".json"


def discard_partial(target):
    for path in partial_paths(target):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def size_of(path):
    """`path`'s size in bytes, 0 when it is missing or unreadable."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def write_all(fd, data):
    """Writes all of `data` to the descriptor `fd` (`os.write` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_failed(what, url, path, error, target):
    """The `DownloadError` of a write that failed (a full disk, a file-size limit, a quota, a read-only file system),
    once the partial file is removed: nothing of the file is left."""
    discard_partial(target)
    reason = error.strerror or one_line(error)
    return DownloadError(
        f"{what}: {url}: cannot write {path}: {reason}: nothing cached (free space there, or set ELMO_TF_HOME to a "
        "cache on another disk)",
        path=path,
    )


def read_state(path, url):
    """The state JSON at `path` when it is a dict recorded for `url`, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("url") == url else None


def save_state(state_path, state, what, url, target):
    """Writes `state` to `state_path` (atomically); a write error is `write_failed`'s `DownloadError`."""
    try:
        write_json(state_path, state)
    except OSError as e:
        raise write_failed(what, url, state_path, e, target) from None


def strong_etag(etag):
    """Whether `etag` is a strong entity tag (RFC 9110 8.8.3): present and not `W/"..."`. Only a strong tag says two
    responses are the same bytes, so only a strong tag may join the bytes of two responses (`If-Range`)."""
    return bool(etag) and not etag.strip()[:2].upper() == "W/"


def resume_proof(state, expected):
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


def usable_partial(target, url, expected, what):
    """The state of `target`'s partial file when a resume of it can be proven right (`resume_proof`); otherwise the
    partial file is discarded (with a warning when it held bytes) and None is returned."""
    partial, state_path = partial_paths(target)
    state = read_state(state_path, url) if os.path.exists(partial) else None
    if state is not None and not resume_proof(state, expected):
        size = size_of(partial)
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


def resumable(target, url, expected):
    """Whether the next call can resume `target`'s partial file: it holds bytes and `resume_proof` vouches for them."""
    partial, state_path = partial_paths(target)
    state = read_state(state_path, url) if os.path.exists(partial) else None
    return state is not None and resume_proof(state, expected) is not None and size_of(partial) > 0
