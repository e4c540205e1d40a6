"""Atomic writes: a file or directory is written under a hidden temporary name beside its target, then renamed.

A reader (a model server polling a directory, the next run reading a cache) sees the old content or the new,
never half of it. Temporary names are `.<target name>.tmp-<pid>-<random>` in the target's directory (the same
file system, so the rename is atomic). A run killed with SIGKILL leaves its temporary behind; the next write to
the same directory calls `remove_stale_temps`, which deletes the temporaries of processes that are no longer
running (on this host: a temporary of a live process, even another user's, is kept).

Example:
    with atomic_path("out/metrics.json") as tmp:
        with open(tmp, "w") as f:
            json.dump(metrics, f)
    # out/metrics.json now holds the whole file; on an exception (or SIGTERM through elmo_tf.cli.run) the
    # temporary is removed and out/metrics.json is unchanged.

`durable=True` (`atomic_path`, `atomic_hdf5`) also survives a power cut: the temporary's data reach the disk (fsync)
before the rename, and the directory entry after it; what a crash leaves is the old file or the whole new one.

A write that fails (a full disk: ENOSPC, a file-size limit: EFBIG, a quota, a read-only file system) raises
`WriteError`, an `OSError` naming the target, after the temporary is removed: the previous file is left as it was.
HDF5 files are written through `atomic_hdf5` (or `HDF5Sink`), which keeps HDF5 itself from ever seeing a failed
write (see `HDF5Sink` for why).
"""

import contextlib
import errno
import io
import json
import logging
import os
import re
import secrets
import shutil
import sys

from elmo_tf.errors import ElmoTFError

logger = logging.getLogger(__name__)

_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}(\.[A-Za-z0-9]+)?$")
# the errors of a full or limited disk, found by their text in messages that carry no errno (TensorFlow's)
WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)


class WriteError(OSError, ElmoTFError):
    """Writing `filename` failed with `errno` / `strerror` (ENOSPC "No space left on device", EFBIG "File too large"
    under a file-size limit, ...). Raised once the writer's temporary is removed: a previous file at `filename` is
    as it was. `str()`: "cannot write '<filename>': <strerror>"."""

    def __str__(self):
        return f"cannot write {self.filename!r}: {self.strerror}"


def write_error(path, error):
    """`error` (an `OSError`, or an exception whose message holds an OS error's text, as TensorFlow's do) as a
    `WriteError` naming `path`; None when no OS error can be read from it."""
    if isinstance(error, WriteError):
        return error
    if isinstance(error, OSError) and error.errno is not None:
        return WriteError(error.errno, error.strerror or os.strerror(error.errno), os.fspath(path))
    text = str(getattr(error, "message", None) or error)
    for code in WRITE_ERRNOS:
        if os.strerror(code) in text:
            return WriteError(code, os.strerror(code), os.fspath(path))
    return None


def temp_name(target, suffix=""):
    """A hidden temporary path beside `target`, marked with this process's id (and ending in `suffix`, for writers
    that insist on an extension)."""
    directory, name = os.path.split(os.path.abspath(target))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # exists, owned by someone else
    return True


def remove_stale_temps(directory, name=None):
    """Removes the temporaries (files or directories) that killed runs left in `directory`: those whose process
    is not running. With `name`, only the temporaries of that target. Returns the removed paths (logged)."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry)
        if not match or (name is not None and match["name"] != name):
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(directory, entry)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            logger.warning("cannot remove the stale temporary %s: %s", path, e)
            continue
        logger.info("removed %s, left by an interrupted run (process %d)", path, pid)
        removed.append(path)
    return removed


def fsync_path(path):
    """Flushes `path`'s data (a file) or entries (a directory) to the disk; its own errors are `OSError`s."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """`fsync_path` of a directory, where the file system allows it (some refuse fsync on a directory: EINVAL)."""
    try:
        fsync_path(path)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


@contextlib.contextmanager
def atomic_path(target, directory=False, overwrite=True, suffix="", durable=False):
    """Yields a temporary path for `target`; when the block ends normally it is renamed to `target`.

    Args:
        target: the final path (its directory must exist).
        directory: the temporary is created as an empty directory (for a SavedModel, say); else it is only a
            name, for the block to create as a file.
        overwrite: replace an existing `target` (files only: `os.replace`); False raises `FileExistsError` when
            `target` exists at the end, and the temporary is removed.
        suffix: the temporary's name ends with it (`model.save` wants ".keras").
        durable: fsync the temporary (a file; every file of a directory) before the rename and the parent directory
            after it, so that `target` survives a power cut whole once the block has ended.
    Stale temporaries of `target` left by killed runs are removed first. On any exception (KeyboardInterrupt and
    SystemExit included) the temporary is removed and `target` is left as it was.
    """
    target = os.path.abspath(target)
    parent, name = os.path.split(target)
    remove_stale_temps(parent, name)
    tmp = temp_name(target, suffix)
    try:
        if directory:
            make_public_dir(tmp)
        yield tmp
        if not overwrite and os.path.exists(target):
            raise FileExistsError(f"{target} exists and is not overwritten")
        if durable:
            _fsync_tree(tmp)
        if directory:
            if os.path.exists(target):
                raise FileExistsError(f"{target} exists and is not overwritten")
            os.rename(tmp, target)
        else:
            os.replace(tmp, target)
        if durable:
            fsync_dir(parent)
    finally:
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)


def _fsync_tree(path):
    if not os.path.isdir(path):
        fsync_path(path)
        return
    for root, _dirs, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_dir(root)


def stdout_write_error(error):
    """`error`, a failed write to stdout (a full disk under `> file`), as a `WriteError` naming stdout's file (or
    "<stdout>"). Stdout's file descriptor is pointed at /dev/null first, so that the interpreter's final flush of what
    is still buffered does not fail again ("Exception ignored ... OSError") after the one-line error."""
    try:
        name = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, AttributeError):
        name = "<stdout>"
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return write_error(name, error) or error


def make_public_dir(path):
    """`os.mkdir(path)` with the mode the umask allows (`mkdir` alone would apply the umask twice over nothing: the
    point is a directory as readable as any other the user makes, for a model server running as another user)."""
    os.mkdir(path)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def write_text(path, text, encoding="utf-8"):
    """Writes `text` to `path` atomically. Raises `WriteError` when the disk refuses it (the old file is kept)."""
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding=encoding) as f:
                f.write(text)
    except OSError as e:
        raise (write_error(path, e) or e) from None


def write_json(path, data, **kwargs):
    """Writes `data` as JSON (indent 2 unless given) to `path` atomically."""
    kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(data, **kwargs) + "\n")


class HDF5Sink(io.RawIOBase):
    """The file h5py writes through (`h5py.File(sink, "w")`, its "fileobj" driver): a failed write never reaches HDF5.

    HDF5 does not survive a failed write. Through its default driver a full disk (ENOSPC) or a file-size limit (EFBIG)
    surfaces in h5py's object destructors, where Python cannot catch it ("Exception ignored in
    h5py._objects.ObjectID.__dealloc__", thousands of times), and closing the file then crashes the process (SIGSEGV:
    seen with h5py 3.14 / HDF5 1.14.6). Here the first failed write is recorded in `error`, and that write and every
    later one are kept in memory instead (reads see them), so HDF5 goes on with a file that works; the writer calls
    `check()` (after each dataset, say), which raises `WriteError`, closes the HDF5 file and this sink and removes the
    file. Memory then holds only what HDF5 wrote after the failure (the rest of one dataset and the metadata written at
    close).

    Args:
        path: the file to create (truncated when it exists).
        target: the path `WriteError` names (the final output when `path` is its temporary); default `path`.
    """

    def __init__(self, path, target=None):
        super().__init__()
        self.path = os.fspath(path)
        self.target = os.fspath(target if target is not None else path)
        self.error = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pos = 0
        self._end = 0
        self._kept = []  # (offset, bytes) of the writes since the failure, in order

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=os.SEEK_SET):
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._end}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self):
        return self._pos

    def write(self, data):
        view = memoryview(data).cast("B")
        if self.error is None:
            done = 0
            try:
                while done < len(view):  # a short write (the disk just filled up) is followed by the failing one
                    done += os.pwrite(self._fd, view[done:], self._pos + done)
            except OSError as e:
                self.error = e
        if self.error is not None:
            self._kept.append((self._pos, bytes(view)))
        self._pos += len(view)
        self._end = max(self._end, self._pos)
        return len(view)

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        size = max(0, min(len(view), self._end - self._pos))
        data = os.pread(self._fd, size, self._pos)
        view[: len(data)] = data
        view[len(data) : size] = bytes(size - len(data))  # never written to the disk: zeros, unless kept below
        start, stop = self._pos, self._pos + size
        for offset, kept in self._kept:
            low, high = max(start, offset), min(stop, offset + len(kept))
            if low < high:
                view[low - start : high - start] = kept[low - offset : high - offset]
        self._pos = stop
        return size

    def truncate(self, size=None):
        size = self._pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as e:
                self.error = e
        self._end = size
        return size

    def flush(self):
        pass

    def close(self):
        if not self.closed:
            try:
                os.close(self._fd)
            except OSError as e:  # a delayed write error (a network file system)
                if self.error is None:
                    self.error = e
        super().close()

    def check(self):
        """Raises `WriteError` naming `target` when a write failed."""
        if self.error is not None:
            raise write_error(self.target, self.error) or self.error


@contextlib.contextmanager
def atomic_hdf5(target, durable=False):
    """Yields an `h5py.File` open for writing, written under a temporary name (`atomic_path`) through an `HDF5Sink`
    and renamed to `target` when the block ends normally.

    Raises:
        WriteError: a write failed (a full disk, a file-size limit): the file is closed, the temporary removed, and
            `target` is as it was.
    `durable`: see `atomic_path`.

    Example:
        with atomic_hdf5("weights.hdf5") as f:
            f.create_dataset("W", data=w)
    """
    import h5py

    with atomic_path(target, durable=durable) as tmp:
        sink = HDF5Sink(tmp, target)
        try:
            with h5py.File(sink, "w") as f:
                yield f
                sink.check()  # before closing: an error is raised once, not also for the metadata written at close
        finally:
            sink.close()
        sink.check()
