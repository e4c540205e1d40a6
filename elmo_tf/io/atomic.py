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
"""

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil

logger = logging.getLogger(__name__)

_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}(\.[A-Za-z0-9]+)?$")


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


@contextlib.contextmanager
def atomic_path(target, directory=False, overwrite=True, suffix=""):
    """Yields a temporary path for `target`; when the block ends normally it is renamed to `target`.

    Args:
        target: the final path (its directory must exist).
        directory: the temporary is created as an empty directory (for a SavedModel, say); else it is only a
            name, for the block to create as a file.
        overwrite: replace an existing `target` (files only: `os.replace`); False raises `FileExistsError` when
            `target` exists at the end, and the temporary is removed.
        suffix: the temporary's name ends with it (`model.save` wants ".keras").
    Stale temporaries of `target` left by killed runs are removed first. On any exception (KeyboardInterrupt and
    SystemExit included) the temporary is removed and `target` is left as it was.
    """
    target = os.path.abspath(target)
    parent, name = os.path.split(target)
    remove_stale_temps(parent, name)
    tmp = temp_name(target, suffix)
    try:
        if directory:
            os.mkdir(tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)
        yield tmp
        if not overwrite and os.path.exists(target):
            raise FileExistsError(f"{target} exists and is not overwritten")
        if directory:
            if os.path.exists(target):
                raise FileExistsError(f"{target} exists and is not overwritten")
            os.rename(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)


def write_text(path, text, encoding="utf-8"):
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding=encoding) as f:
            f.write(text)


def write_json(path, data, **kwargs):
    """Writes `data` as JSON (indent 2 unless given) to `path` atomically."""
    kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(data, **kwargs) + "\n")
