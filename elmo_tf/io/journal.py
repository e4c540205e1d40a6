"""A resumable run's journal: the finished parts of a long job, kept beside its output until the job ends.

A job that writes one big file (`elmo_tf.embed.embed_file`) writes its work as numbered shards first, in a hidden
directory beside the output, `.<output name>.partial/`:
    manifest.json         what the run is (a fingerprint: input content, model, every option that changes the
                          output), written once at the start
    shard-000000.hdf5 ... the finished shards, each written under a temporary name, fsync'd, renamed, the
                          directory fsync'd (`elmo_tf.io.atomic.atomic_path(durable=True)`)
The job then builds the output from its shards (atomically, as any output) and removes the directory.

Why nothing an interruption leaves can be misread, whenever it comes (SIGKILL, SIGTERM, Ctrl-C, a power cut):
    - a shard exists under its own name only once it is complete and on the disk; a shard being written is a
      temporary (`.shard-000003.hdf5.tmp-<pid>-<random>`), which the next run removes;
    - the manifest exists only whole (same temporary + rename); without it the directory counts as empty;
    - clearing (a run without resume) and the final removal delete the manifest first;
    - one run at a time: the run holds an exclusive `flock` on the directory (released by the kernel when the
      process dies, however it dies); a second run into the same output is refused (`JournalBusy`).
A run asked to resume (`resume=True`) compares its fingerprint with the manifest's and refuses to go on when any
entry differs (`ResumeRefused`, naming every entry with both values); without `resume` the old state is removed.

For the tests, `ELMO_TF_FAULT="<point>:<k>:<SIGNAL>"` (e.g. "shard-write:2:SIGKILL") makes the process send itself
SIGNAL the k-th time it passes `fault_point("<point>")`; see `elmo_tf.embed` for its points.
"""

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import atomic_path, fsync_dir, make_public_dir, write_error
from elmo_tf.io.text import TextFileError

logger = logging.getLogger(__name__)

STATE_SUFFIX = ".partial"
MANIFEST = "manifest.json"
FORMAT = 1  # of the journal: a manifest of another format is never resumed
FAULT_ENV = "ELMO_TF_FAULT"
_SHARD = re.compile(r"^shard-(?P<number>[0-9]{6,})(?P<suffix>\.[A-Za-z0-9]+)$")
_fault = {"spec": None, "counts": {}}


def finished_shards(path, suffix=None):
    """`{number: file}` of the finished shards in the journal directory `path` (those of `suffix`, or of any)."""
    found = {}
    for entry in sorted(os.listdir(path)):
        match = _SHARD.match(entry)
        if match and suffix in (None, match["suffix"]):
            found[int(match["number"])] = os.path.join(path, entry)
    return found


class ResumeRefused(ElmoTFError):
    """The partial run in `path` differs from this one. `differences`: list of `(name, then, now)`, with the values
    as shown (`then`: the partial run's, `now`: this run's)."""

    def __init__(self, path, differences):
        self.differences = list(differences)
        shown = "; ".join(f"{name}: {then} (partial run) vs {now} (this run)" for name, then, now in self.differences)
        super().__init__(f"cannot resume the partial run in {path}: {shown}", key="resume", path=path)


class JournalMismatch(ElmoTFError):
    """A finished shard of the journal is not what the run's plan gives that shard (`path`: the shard file): a
    manifest edited by hand, a shard put there from another run, a shard the plan has no place for. Nothing is
    removed: the journal is kept as it is, and the message says how to go on."""

    def __init__(self, shard_path, what):
        super().__init__(
            f"{shard_path} {what}: the journal does not match its shards (edited, or a shard of another run); "
            f"it is kept as it is: remove that shard and resume, or run without --resume to start over",
            key="resume",
            path=shard_path,
        )


class JournalBusy(ElmoTFError):
    """Another live process holds the journal (`path`): two runs into one output would mix their shards."""


class NotAJournal(ElmoTFError):
    """The journal's path (`path`) holds something no run made: a symbolic link, a file, or a directory with files no
    run wrote. Left as it is (clearing it would delete someone's files); the caller picks another output."""


def fault_point(point):
    """Test hook (see the module docstring): signals this process the k-th time `point` is passed, when
    `ELMO_TF_FAULT` asks for it; otherwise nothing."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    if _fault["spec"] != spec:
        _fault["spec"], _fault["counts"] = spec, {}
    name, _, rest = spec.partition(":")
    k, _, signame = rest.partition(":")
    if name != point:
        return
    if not (k.isdigit() and signame.startswith("SIG") and isinstance(getattr(signal, signame, None), int)):
        logger.warning("ignoring %s=%r: expected <point>:<k>:<SIGNAL>", FAULT_ENV, spec)  # a test hook, never a crash
        return
    count = _fault["counts"][point] = _fault["counts"].get(point, 0) + 1
    if count == int(k):
        os.kill(os.getpid(), getattr(signal, signame))


def input_fingerprint(digest):
    """The input's entry of a run's fingerprint: its content (`file_digest`'s sha256 and size), not its name."""
    return {"sha256": digest["sha256"], "size": digest["size"]}


def numbered_shards(items, shard_tokens, tokens_of):
    """`(shard number, item)` for each of `items`: a shard ends with the item that brings its tokens (`tokens_of(item)`)
    to `shard_tokens` or more, so a shard's content is a function of the input and the settings alone, never of time
    (embed's and score's runs, and their resumes, cut the same shards)."""
    number = tokens = 0
    for item in items:
        yield number, item
        tokens += tokens_of(item)
        if tokens >= shard_tokens:
            number, tokens = number + 1, 0


def file_state(path):
    """What tells that the file at `path` was changed or replaced: device, inode, size and mtime (ns)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def check_unchanged(path, before):
    """Raises `TextFileError` when the file at `path` is not as it was when hashed (`file_state` then): a run's shards
    may mix two contents under the fingerprint of one."""
    try:
        now = file_state(path)
    except OSError:
        now = None
    if now != before:
        raise TextFileError(
            f"{path}: changed while it was read (size, time or file replaced); the output was not written: run "
            "again once it is complete",
            path=str(path),
        )


def file_digest(path, chunk=1 << 20):
    """`{"size", "sha256", "lines"}` of the file at `path`, in one read: its size in bytes, the SHA-256 of its content
    (hex) and its lines as `elmo_tf.io.text.raw_lines` counts them (a last line without "\\n" counts)."""
    digest = hashlib.sha256()
    size = newlines = 0
    last = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
            size += len(block)
            newlines += block.count(b"\n")
            last = block[-1:]
    return {"size": size, "sha256": digest.hexdigest(), "lines": newlines + (size > 0 and last != b"\n")}


def state_dir_of(output_path):
    """The journal directory of `output_path`: `.<name>.partial` beside it."""
    parent, name = os.path.split(os.path.abspath(output_path))
    return os.path.join(parent, f".{name}{STATE_SUFFIX}")


class RunJournal:
    """The journal of one run writing `output_path` (see the module docstring); a context manager.

    Args:
        output_path: the job's final output.
        fingerprint: `{name: value}` (JSON values) of everything that changes the output; compared on resume.
        resume: keep the shards of a partial run with the same fingerprint (refuse one with another); False: remove
            any partial state and start over.
        notes: `{name: text}` shown beside a differing value (a path, say); not compared.
        shown: `{name: callable(value) -> str}` to show a value in `ResumeRefused` (a hash cut short, say).
        defaults: `{name: value}` of entries added to the fingerprint after journals were first written: a manifest
            without the entry is compared as if it held this value (the run then was made the way that value says:
            `precision` "float32", say), so adding an entry does not refuse every partial run of an earlier version.
    Attributes (once entered):
        path: the journal directory.
        resumed: True when a partial run was found and is continued.
        done: `{shard number: path}` of the finished shards found (empty unless resumed).
    Leaving the block normally removes the journal (the job is done); leaving it with an exception keeps it for a
    resume when it holds a finished shard, and removes it when it holds none (nothing to resume: no hidden directory
    is left beside the output); the lock is released either way.
    Raises (on entering): `ResumeRefused`, `JournalBusy`, `NotAJournal`, `elmo_tf.io.atomic.WriteError` (the
    directory or the manifest cannot be written).
    """

    def __init__(self, output_path, fingerprint, resume=False, notes=None, shown=None, suffix=".hdf5", defaults=None):
        self.output_path = os.path.abspath(output_path)
        self.fingerprint = dict(fingerprint)
        self.resume = bool(resume)
        self.notes = dict(notes or {})
        self.shown = dict(shown or {})
        self.defaults = dict(defaults or {})
        self.suffix = suffix
        self.path = state_dir_of(output_path)
        self.resumed = False
        self.done = {}
        self._fd = None

    # ---------------------------------------------------------------- entering and leaving

    def __enter__(self):
        self._open_locked()
        try:
            self._check_entries()
            self._remove_temporaries()
            manifest = self._read_manifest()
            if self.resume and manifest is not None:
                differences = self._differences(manifest)
                if differences:
                    raise ResumeRefused(self.path, differences)
                self.resumed = True
                self.done = self._shards()
                self._write_manifest()  # this process's id, for `JournalBusy`
            else:
                if self.resume:
                    logger.info("nothing to resume for %s: starting from the beginning", self.output_path)
                self._clear()
                self._write_manifest()
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None or not self._shards():  # done, or interrupted with nothing a resume could keep
                self._clear()
                os.rmdir(self.path)
        finally:
            self._unlock()
        return False

    def shard_path(self, number):
        """The path of shard `number` (whether or not it exists)."""
        return os.path.join(self.path, f"shard-{number:06d}{self.suffix}")

    def discard(self, number):
        """Removes shard `number` (a file found unreadable), so that it is written again."""
        try:
            os.remove(self.shard_path(number))
        except FileNotFoundError:
            pass
        self.done.pop(number, None)

    # ---------------------------------------------------------------- internals

    def _open_locked(self):
        """Opens and locks the directory at `self.path`, made if missing. A run that ends removes its directory
        while another may have opened it and waits for nothing (the lock is non-blocking) but may lock it just
        after: the lock then holds an unlinked directory, and a third run could lock a new one at the same path.
        So once locked, the path must still be the directory locked; otherwise it is opened again."""
        for _ in range(10):
            if os.path.islink(self.path):  # clearing it would empty the directory it points to
                raise NotAJournal(
                    f"{self.path} is a symbolic link; a run's journal is a directory it makes itself (remove the link)",
                    path=self.path,
                )
            try:
                if not os.path.isdir(self.path):
                    make_public_dir(self.path)
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except FileExistsError:
                raise NotAJournal(f"{self.path} exists and is not a directory", path=self.path) from None
            except FileNotFoundError as e:
                if not os.path.isdir(os.path.dirname(self.path)):  # no directory to make it in: say so
                    raise write_error(self.path, e) from None
                continue  # removed between the two calls by the run that ended
            except OSError as e:
                raise (write_error(self.path, e) or e) from None
            try:
                self._lock()
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            except BaseException:
                self._unlock()
                raise
            locked = os.fstat(self._fd)
            if now is not None and (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino):
                return
            self._unlock()
        raise JournalBusy(f"{self.path}: keeps being removed and made again by other runs", path=self.path)

    def _lock(self):
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            manifest = self._read_manifest() or {}
            who = f"process {manifest['pid']}" if "pid" in manifest else "another process"
            raise JournalBusy(
                f"{self.path}: {who} is writing {self.output_path} (one run at a time into an output)",
                path=self.path,
            ) from None

    def _unlock(self):
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None

    def _entries(self):
        return sorted(os.listdir(self.path))

    def _check_entries(self):
        """Raises `NotAJournal` when the directory holds an entry no run writes (a manifest, shards, temporaries):
        it is not a journal, and clearing it would delete someone's files."""
        for entry in self._entries():
            if not (entry == MANIFEST or _SHARD.match(entry) or (entry.startswith(".") and ".tmp-" in entry)):
                raise NotAJournal(
                    f"{self.path} holds {entry}, which no elmo_tf run wrote: not a run's journal, left as it is "
                    "(move it away, or give another --output)",
                    path=self.path,
                )

    def _remove_temporaries(self):
        """Every temporary in the directory is a dead run's (this process holds the lock): they all go."""
        for entry in self._entries():
            if ".tmp-" in entry:
                _remove(os.path.join(self.path, entry))
                logger.info("removed %s, left by an interrupted run", os.path.join(self.path, entry))

    def _read_manifest(self):
        try:
            with open(os.path.join(self.path, MANIFEST), encoding="utf-8") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # cannot happen through this class (written whole): say so, start over
            logger.warning("ignoring the unreadable %s: %s", os.path.join(self.path, MANIFEST), e)
            return None
        return manifest if isinstance(manifest, dict) else None

    def _show(self, name, value, notes):
        text = self.shown[name](value) if name in self.shown and value is not None else json.dumps(value)
        note = notes.get(name)
        return f"{text} ({note})" if note else text

    def _differences(self, manifest):
        if manifest.get("format") != FORMAT:
            return [("journal format", json.dumps(manifest.get("format")), json.dumps(FORMAT))]
        then = manifest.get("fingerprint", {})
        then_notes = manifest.get("notes", {})
        found = []
        for name in list(then) + [n for n in self.fingerprint if n not in then]:
            old, new = then.get(name, self.defaults.get(name)), self.fingerprint.get(name)
            if old != new:
                found.append((name, self._show(name, old, then_notes), self._show(name, new, self.notes)))
        return found

    def _shards(self):
        return finished_shards(self.path, self.suffix)

    def _clear(self):
        """Removes the manifest first (a directory without one is empty to a resume), then everything else."""
        manifest = os.path.join(self.path, MANIFEST)
        if os.path.lexists(manifest):
            os.remove(manifest)
            fsync_dir(self.path)
        for entry in self._entries():
            _remove(os.path.join(self.path, entry))

    def _write_manifest(self):
        manifest = {
            "format": FORMAT,
            "output": self.output_path,
            "pid": os.getpid(),
            "fingerprint": self.fingerprint,
            "notes": self.notes,
        }
        target = os.path.join(self.path, MANIFEST)
        try:
            with atomic_path(target, durable=True) as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(manifest, f, indent=2)
                fault_point("manifest")
        except OSError as e:
            raise (write_error(target, e) or e) from None


def _remove(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass


__all__ = [
    "FAULT_ENV",
    "JournalBusy",
    "JournalMismatch",
    "NotAJournal",
    "ResumeRefused",
    "RunJournal",
    "check_unchanged",
    "fault_point",
    "file_digest",
    "file_state",
    "finished_shards",
    "state_dir_of",
]
