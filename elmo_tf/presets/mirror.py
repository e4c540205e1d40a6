"""A mirror of the download URLs (`$ELMO_TF_MIRROR`): where a URL's copy lies, and the copy of a mirror directory's
file into place.

`mirrored(url, mirror)` maps a URL to `<mirror>/<host>/<path>`, the layout `wget -x` writes, under a base URL or a
directory. A directory's file must resolve (links followed) inside the mirror directory and be a regular file: a
link out of it, a FIFO, a device or a directory is refused. `copy_local` copies it as a download is written: to the
partial file beside the target, bounded, verified, then renamed (`elmo_tf.presets.download.fetch` calls it for a
path that is not a URL).
"""

import os
import stat
import urllib.parse

from elmo_tf.errors import not_a_regular_file
from elmo_tf.presets.file_checks import CHUNK, MAX_DOWNLOAD_ENV, DownloadError, verify
from elmo_tf.presets.partial_file import discard_partial, partial_paths, write_all, write_failed


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


def _copy_fd(source, partial, limit, what, path):
    """Copies the open file `source` (a descriptor; `path` names it) to a new `partial`; returns the bytes copied,
    stopping past `limit` (a file that grows while copied). A read error is a `DownloadError`; a write error is the
    `OSError` itself (the caller's `write_failed`)."""
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
            write_all(fd, chunk)
    finally:
        os.close(fd)
    return copied


def _open_mirror_file(path, what):
    """A read-only descriptor of the mirror directory's regular file `path`, opened without following a link in its
    last component and without blocking on a FIFO put there since it was checked."""
    kind = not_a_regular_file(path)
    if kind is not None:
        where = "no such file in the mirror directory" if kind == "no such file" else f"{kind}: refused"
        raise DownloadError(f"{what}: {path}: {where}", key="ELMO_TF_MIRROR", path=path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        return os.open(os.path.realpath(path), flags)
    except OSError as e:
        raise DownloadError(
            f"{what}: {path}: cannot read it in the mirror directory: {e.strerror}", key="ELMO_TF_MIRROR", path=path
        ) from None


def copy_local(path, target, expected, what, ceiling):
    """Copies a mirror directory's file to `target`: a regular file (`mirrored` has checked that it resolves inside
    the mirror), at most `expected.size` bytes, else at most `ceiling`, verified against `expected`; returns
    `{"size", "sha256", "etag": None, "url": path}`."""
    source = _open_mirror_file(path, what)
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
            raise write_failed(what, path, partial, e, target) from None
        if copied > limit:
            raise DownloadError(f"{what}: {path}: grew past {limit} bytes while copied: refused", path=path)
        record = verify(partial, expected, f"{what} from {path}")
        try:
            os.replace(partial, target)
        except OSError as e:
            raise write_failed(what, path, target, e, target) from None
    except BaseException:
        discard_partial(target)
        raise
    finally:
        os.close(source)
    return {**record, "etag": None, "url": path}
