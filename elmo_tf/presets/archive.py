"""Unpacking a downloaded archive (a .zip, a .tar or .tar.gz / .tar.bz2 / .tar.xz) without trusting it.

Refused, before a byte is written: a member whose name is absolute, has a drive, or climbs out with `..`; a link
(symbolic or hard), a device, a FIFO; more members than `max_members`; declared sizes that add up to more than
`max_bytes`. While writing, the bytes actually produced are counted against the same bound, so an archive that lies
about its sizes (a zip bomb) stops there too. Nothing is executed or interpreted: members are only copied out, with
permissions 0644 / 0755 (no set-id bits, no owners). `zipfile` and `tarfile` read the formats; the checks are ours
(tarfile's `filter="data"` covers part of them for tar, zipfile has none).

A tar's decompressed stream is read through `_Bounded`, which never lets it go past the bound: the headers, the
members' data and what follows the end-of-archive blocks together stay within `max_bytes` plus a small allowance per
member for headers; one read (tarfile reads a long name's or a pax header's data whole, into memory) is at most
`MAX_READ`. After the end-of-archive blocks only zeros may follow (a tar's padding to its record size), at most
`MAX_TRAILING_BYTES` of them and no more than what is left of `max_bytes`; they are read (bounded) so that gzip, bz2
and xz check their trailers. A zip is read from its central directory, member by member, each bounded by what it
declares: what lies outside its members is never decompressed.
"""

import bz2
import contextlib
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib

from elmo_tf.errors import ElmoTFError, one_line

MAX_BYTES = 8 << 30  # the largest released ELMo archive unpacks to well under 1 GiB
MAX_MEMBERS = 10_000
MAX_TRAILING_BYTES = 16 << 20  # zeros after a tar's end: its padding to a record (10 KiB by default, 1 MiB at -b 2048)
MAX_READ = 4 << 20  # one read of a tar's stream: a header's data (long names, pax records) is read whole
_HEADER_ALLOWANCE = 4 * 512  # per member, beyond its data: its header, a pax or long-name header, the padding
_COPY = 1 << 20
_MAGIC = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


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
    """Unpacks `archive` (zip, or tar plain or compressed with gzip, bz2 or xz) into the existing empty directory
    `dest`.

    Raises:
        ArchiveError: an unsafe or unreadable archive (`dest` may hold part of it: callers unpack into a temporary
            directory and remove it). The message names `archive`, never `dest`.
    """
    if zipfile.is_zipfile(archive):
        return _extract_zip(archive, dest, max_bytes, max_members)
    try:
        with open(archive, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise ArchiveError(f"{archive}: not a readable archive: {e}", path=archive) from None
    opener = next((opener for prefix, opener in _MAGIC if magic.startswith(prefix)), open)
    return _extract_tar(archive, opener, dest, max_bytes, max_members)


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


class _Bounded:
    """The decompressed stream of a tar archive as tarfile reads it (`read`, `seek`, `tell`), never past `limit`
    bytes from its start, and never more than `MAX_READ` bytes in one read: a stream that would go further raises
    `ArchiveError` before it is decompressed (or, for one read, allocated)."""

    def __init__(self, archive, raw, limit):
        self.archive, self.raw, self.limit = archive, raw, limit
        self.name = os.fspath(archive)
        self.last = (0, b"")  # the position and bytes of the last read: the end-of-archive block, once listed

    def _over(self, what):
        return ArchiveError(
            f"{self.archive}: {what} past the bound of {self.limit} bytes of its unpacked stream: refused",
            path=self.archive,
        )

    def tell(self):
        return self.raw.tell()

    def seek(self, offset, whence=os.SEEK_SET):
        if whence == os.SEEK_SET and offset > self.limit:
            raise self._over(f"a member's data reaches byte {offset}")
        return self.raw.seek(offset, whence)

    def read(self, size=-1):
        if size is None or size < 0 or size > MAX_READ:
            raise ArchiveError(
                f"{self.archive}: a header asks for {size} bytes at once (a long name or pax records; at most "
                f"{MAX_READ}): refused",
                path=self.archive,
            )
        position = self.raw.tell()
        data = self.raw.read(min(size, self.limit - position + 1))
        if position + len(data) > self.limit:
            raise self._over("it goes on")
        self.last = (position, data)
        return data


def _check_trailer(archive, stream, end, room):
    """Reads what follows the end of the archive (`end`: the first end-of-archive block, where tarfile stopped), at
    most `room` bytes, all zeros (the end blocks and a tar's padding to its record size). Reading it to its end also
    makes gzip / bz2 / xz check their trailers (CRC, size): tarfile stops at the last header, and a corrupted or
    truncated archive would unpack silently."""
    start, data = stream.last
    position = stream.tell()
    if start <= end <= position == start + len(data):
        tail = data[end - start :]  # read already, while tarfile looked for a next header
    else:
        stream.seek(end)
        tail = b""
    seen = 0
    while True:
        if tail.count(0) != len(tail):
            raise ArchiveError(f"{archive}: data after the end of the tar archive: refused", path=archive)
        seen += len(tail)
        if seen > room:
            raise ArchiveError(
                f"{archive}: more than {room} zero bytes after the end of the tar archive (its padding: at most "
                f"{MAX_TRAILING_BYTES}, and within the bound on unpacked bytes): refused",
                path=archive,
            )
        tail = stream.read(min(_COPY, room + 1 - seen))
        if not tail:
            return


def _extract_tar(archive, opener, dest, max_bytes, max_members):
    limit = max_bytes + _HEADER_ALLOWANCE * max_members + MAX_TRAILING_BYTES
    try:
        with opener(archive, "rb") as raw:
            stream = _Bounded(archive, raw, limit)
            try:
                t = tarfile.open(fileobj=stream, mode="r:")
            except tarfile.ReadError:
                if opener is open:
                    raise ArchiveError(f"{archive}: neither a zip nor a tar archive", path=archive) from None
                raise
            with t:
                members = []
                for member in t:  # streams through a .tar.gz once to list it
                    members.append(member)
                    _budget(archive, sum(m.size for m in members), len(members), max_bytes, max_members)
                    if not (member.isreg() or member.isdir()):
                        raise ArchiveError(
                            f"{archive}: member {member.name!r} is a link or a special file: refused", path=archive
                        )
                    _check_name(archive, member.name, member.isdir())
                room = max(max_bytes - sum(m.size for m in members), tarfile.RECORDSIZE)  # one record: the format's
                _check_trailer(archive, stream, t.offset, min(room, MAX_TRAILING_BYTES))
                plan = [(m.name, m.isdir(), m.size, lambda m=m: t.extractfile(m)) for m in members]
                _write_members(archive, dest, plan, max_bytes)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as e:
        raise ArchiveError(f"{archive}: not a readable tar archive: {one_line(e)}", path=archive) from None
    except OSError as e:
        if e.filename is not None or e.errno is not None:
            raise  # the file system's (a full disk while writing a member): as it is
        raise ArchiveError(f"{archive}: not a readable tar archive: {one_line(e)}", path=archive) from None


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
