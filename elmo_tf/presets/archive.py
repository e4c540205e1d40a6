"""Unpacking a downloaded archive (a .zip, a .tar or .tar.gz) without trusting it.

Refused, before a byte is written: a member whose name is absolute, has a drive, or climbs out with `..`; a link
(symbolic or hard), a device, a FIFO; more members than `max_members`; declared sizes that add up to more than
`max_bytes`. While writing, the bytes actually produced are counted against the same bound, so an archive that lies
about its sizes (a zip bomb) stops there too. Nothing is executed or interpreted: members are only copied out, with
permissions 0644 / 0755 (no set-id bits, no owners). `zipfile` and `tarfile` read the formats; the checks are ours
(tarfile's `filter="data"` covers part of them for tar, zipfile has none).
"""

import contextlib
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib

from elmo_tf.errors import ElmoTFError

MAX_BYTES = 8 << 30  # the largest released ELMo archive unpacks to well under 1 GiB
MAX_MEMBERS = 10_000
_COPY = 1 << 20


class ArchiveError(ElmoTFError):
    """An archive that is not safe or not readable; nothing of it is kept."""


def _check_name(archive, name, is_dir=False):
    """`name` as a relative path inside the archive's directory, or None for that directory itself (`./`, which
    `tar -C dir .` writes first)."""
    normalized = name.replace("\\", "/")
    parts = [p for p in normalized.split("/") if p not in ("", ".")]
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":") or ".." in parts:
        raise ArchiveError(f"{archive}: member {name!r} leaves the archive's directory: refused", path=archive)
    if not parts:
        if is_dir:
            return None
        raise ArchiveError(f"{archive}: member {name!r} has no name: refused", path=archive)
    return os.path.join(*parts)


def _budget(archive, total, count, max_bytes, max_members):
    if count > max_members:
        raise ArchiveError(f"{archive}: {count} members, more than {max_members}: refused", path=archive)
    if total > max_bytes:
        raise ArchiveError(
            f"{archive}: declares {total} unpacked bytes, more than the bound of {max_bytes}: refused", path=archive
        )


def _copy(archive, source, target, room):
    """Copies at most `room` bytes of `source` to a new file `target`; returns the count."""
    written = 0
    with open(target, "xb") as out:
        while chunk := source.read(_COPY):
            written += len(chunk)
            if written > room:
                raise ArchiveError(
                    f"{archive}: unpacks to more than its declared sizes or the bound: refused", path=archive
                )
            out.write(chunk)
    os.chmod(target, 0o644)
    return written


def extract(archive, dest, max_bytes=MAX_BYTES, max_members=MAX_MEMBERS):
    """Unpacks `archive` (zip or tar, any compression tarfile reads) into the existing empty directory `dest`.

    Raises:
        ArchiveError: an unsafe or unreadable archive (`dest` may hold part of it: callers unpack into a temporary
            directory and remove it).
    """
    if zipfile.is_zipfile(archive):
        return _extract_zip(archive, dest, max_bytes, max_members)
    try:
        is_tar = tarfile.is_tarfile(archive)
    except (OSError, EOFError, tarfile.TarError) as e:  # gzip's EOFError: cut off before its first tar header
        raise ArchiveError(f"{archive}: not a readable archive: {e}", path=archive) from None
    if is_tar:
        return _extract_tar(archive, dest, max_bytes, max_members)
    raise ArchiveError(f"{archive}: neither a zip nor a tar archive", path=archive)


def _extract_zip(archive, dest, max_bytes, max_members):
    try:
        with zipfile.ZipFile(archive) as z:
            members = z.infolist()
            _budget(archive, sum(m.file_size for m in members), len(members), max_bytes, max_members)
            plan = []
            for member in members:
                kind = stat.S_IFMT(member.external_attr >> 16)  # 0: no Unix type recorded (a plain file)
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise ArchiveError(
                        f"{archive}: member {member.filename!r} is a link or a special file: refused", path=archive
                    )
                _check_name(archive, member.filename, member.is_dir())  # every name, before a byte is written
                plan.append((member.filename, member.is_dir(), member.file_size, lambda m=member: z.open(m)))
            _write_members(archive, dest, plan, max_bytes)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as e:
        raise ArchiveError(f"{archive}: not a readable zip: {e}", path=archive) from None


def _write_members(archive, dest, plan, max_bytes):
    """Writes each `(name, is_dir, declared size, open)` of `plan` (every name already checked) under `dest`, with
    the bytes written bounded by the declared sizes and by `max_bytes` in all."""
    room = max_bytes
    for name, is_dir, size, open_member in plan:
        relative = _check_name(archive, name, is_dir)
        if relative is None:
            continue
        with _clash(archive, name):
            target = os.path.join(dest, relative)
            if is_dir:
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open_member() as source:
                room -= _copy(archive, source, target, min(room, size))


@contextlib.contextmanager
def _clash(archive, name):
    """Members that collide (a name twice, a file then members under it, a directory then a file of its name) are
    refused, naming the member; other OS errors (a full disk) go through as they are."""
    try:
        yield
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise ArchiveError(
            f"{archive}: member {name!r} collides with another member of the same path: refused", path=archive
        ) from None


def _read_to_end(archive, fileobj):
    """Reads a compressed tar's stream past the end-of-archive block, so gzip / bz2 / xz check their trailer
    (CRC, size): tarfile stops at the last header and a corrupted or truncated archive would unpack silently."""
    while fileobj.read(_COPY):
        pass


def _extract_tar(archive, dest, max_bytes, max_members):
    try:
        with tarfile.open(archive) as t:
            members = []
            for member in t:  # streams through a .tar.gz once to list it
                members.append(member)
                _budget(archive, sum(m.size for m in members), len(members), max_bytes, max_members)
                if not (member.isreg() or member.isdir()):
                    raise ArchiveError(
                        f"{archive}: member {member.name!r} is a link or a special file: refused", path=archive
                    )
                _check_name(archive, member.name, member.isdir())
            _read_to_end(archive, t.fileobj)
            plan = [(m.name, m.isdir(), m.size, lambda m=m: t.extractfile(m)) for m in members]
            _write_members(archive, dest, plan, max_bytes)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as e:
        raise ArchiveError(f"{archive}: not a readable tar archive: {e}", path=archive) from None


def model_root(directory, marker):
    """The directory under `directory` that holds `marker` (a file name): `directory` itself, or the one
    subdirectory chain an archive wraps its files in; None when there is none or more than one."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith("__MACOSX")]
        if marker in files:
            found.append(root)
    return found[0] if len(found) == 1 else None


def remove_tree(path):
    shutil.rmtree(path, ignore_errors=True)
