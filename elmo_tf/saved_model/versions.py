"""Version directories of a SavedModel base, as TF Serving's file-system source reads them: `<base>/<version>/`.

`publish_version` is the versioning both the ELMo and the NER tagger exports use. A version is written to a hidden
temporary directory in the base (`.export.tmp-<pid>-<random>`: not a number, so TF Serving's file-system source
ignores it), checked, then renamed into place, so a model server polling `<base>` never sees a half-written
version; an existing version is never overwritten; the temporaries of a killed export are removed by the next export
to the same base.

Concurrent exports into one base: without an explicit version each takes the next free number when it publishes,
not when it starts: the rename of a (non-empty) directory onto an existing one fails, so of two exports renaming to
the same number one wins and the other tries the next number.
"""

import errno
import logging
import os
import shutil

import tensorflow as tf

from elmo_tf.bounds import INT64_MAX
from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import WRITE_ERRNOS, make_public_dir, remove_stale_temps, temp_name, write_error

logger = logging.getLogger(__name__)


class ExportError(ElmoTFError, RuntimeError):
    """An export that could not be written or whose reloaded outputs differ from the Keras model's."""


def parse_version(name):
    """The version number a model server reads from a directory name, as TF Serving's file-system source does: ASCII
    digits that fit in int64 ("007" -> 7); None for any other name (overflowing numbers included)."""
    if not (name.isascii() and name.isdigit()):
        return None
    number = int(name)
    return number if number <= INT64_MAX else None


def existing_versions(base_dir):
    """The version numbers of the directories under `base_dir` (as `parse_version` reads their names), sorted."""
    if not os.path.isdir(base_dir):
        return []
    return sorted(
        {
            version
            for name in os.listdir(base_dir)
            if (version := parse_version(name)) is not None and os.path.isdir(os.path.join(base_dir, name))
        }
    )


def next_version(base_dir):
    """1 for a new base directory, else the highest integer version + 1."""
    versions = existing_versions(base_dir)
    return versions[-1] + 1 if versions else 1


def check_version(version):
    """Raises ValueError unless `version` is None or an int in [1, 2**63 - 1] (a name TF Serving reads as an int64;
    it also reads 0 and negative names, which the versions counted up from 1 never need)."""
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= INT64_MAX
    ):
        raise ValueError(f"version must be an int in [1, 2**63 - 1], got {version!r}")


def _exists_error(base_dir, version):
    final = os.path.join(base_dir, str(version))
    return FileExistsError(f"version {version} already exists at {final}; versions are never overwritten")


def _make_base(base_dir):
    """Creates `base_dir` and its missing parents; returns those it created, deepest first."""
    created, path = [], base_dir
    while not os.path.isdir(path):
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(base_dir, exist_ok=True)
    return created


def _rename_to_version(tmp, base_dir, version):
    """Renames `tmp` (a non-empty directory) to `<base_dir>/<version>`; False when that version exists (under any
    name, or appearing meanwhile: renaming onto a non-empty directory fails, which makes the claim exclusive)."""
    if version in existing_versions(base_dir):  # also under another name ("007" is version 7)
        return False
    final = os.path.join(base_dir, str(version))
    if os.path.lexists(final):  # an empty directory or a file: `rename` would replace the one, fail on the other
        return False
    try:
        os.rename(tmp, final)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def publish_version(base_dir, version, write):
    """Creates `<base_dir>/<version>/` atomically: `write(tmp_dir)` fills a hidden temporary directory in `base_dir`
    (and may check it), which is renamed into place only when `write` returns. Returns the final path.

    Args:
        base_dir: the model's base path (created with its parents when missing; removed again when the export
            fails and it is still empty).
        version: an int in [1, 2**63 - 1], or None: the next free number when the export is published (the highest
            existing version + 1, retried with the next one when another export takes it meanwhile).
        write: `write(tmp_dir)`; what it writes makes the directory non-empty, which the exclusive rename needs.
    Raises:
        FileExistsError: `version` exists (versions are never overwritten), before `write` or once it returned.
        elmo_tf.io.atomic.WriteError: the disk refused the export (full: ENOSPC; a file-size limit: EFBIG); nothing
            is published and the temporary directory is removed.
    """
    check_version(version)
    base_dir = os.path.abspath(base_dir)
    if version is not None and version in existing_versions(base_dir):
        raise _exists_error(base_dir, version)
    created = _make_base(base_dir)
    tmp = None
    try:
        remove_stale_temps(base_dir)  # any export's, left by a killed one
        tmp = temp_name(os.path.join(base_dir, "export"))
        make_public_dir(tmp)
        try:
            write(tmp)
        except (OSError, tf.errors.OpError) as e:  # TensorFlow writes the variables and reports ENOSPC as its own
            error = write_error(base_dir, e)
            if error is None or error.errno not in WRITE_ERRNOS:
                raise
            raise error from None
        if version is not None:
            if not _rename_to_version(tmp, base_dir, version):
                raise _exists_error(base_dir, version)
        else:
            version = next_version(base_dir)
            while version > INT64_MAX or not _rename_to_version(tmp, base_dir, version):
                if version > INT64_MAX:
                    raise ExportError(f"no version number is left in {base_dir}: version 2**63 - 1 exists")
                version = max(version + 1, next_version(base_dir))
        tmp = None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for path in created:  # deepest first; one that another export wrote into stays
            try:
                os.rmdir(path)
            except OSError:
                break
        raise
    final = os.path.join(base_dir, str(version))
    logger.info("published %s", final)
    return final
