"""elmo_tf.presets.archive: good zips and tarballs unpack byte for byte with 0644 files; unsafe members (names that
climb out or are absolute, links, devices, FIFOs, too many members, too many bytes, repeated names) are refused with
an ArchiveError that names the archive and the member, before anything lands outside `dest`; `model_root`."""

import io
import os
import re
import stat
import struct
import tarfile
import time
import warnings
import zipfile

import pytest

from elmo_tf.presets.archive import ArchiveError, extract, model_root

FILES = {
    "model/options.json": b'{"lstm": {"dim": 16}}\n',
    "model/weights.hdf5": os.urandom(70_000),
    "model/sub/vocab.txt": b"<S>\n</S>\n<UNK>\nthe\n",
}


@pytest.fixture
def dest(tmp_path):
    """An empty `dest` alone in a watched parent (`out/`); archives are built in `src/`, outside it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "out" / "dest").mkdir(parents=True)
    return tmp_path / "out" / "dest"


def outside(dest):
    """Everything under dest's parent that is not dest itself (must stay empty)."""
    found = []
    for root, dirs, files in os.walk(dest.parent):
        for name in dirs + files:
            path = os.path.join(root, name)
            if path != str(dest) and not path.startswith(str(dest) + os.sep):
                found.append(path)
    return found


def written(dest):
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(dest) for f in files)


def make_zip(path, members):
    """`members`: (name or ZipInfo, bytes) pairs, written as given (duplicates included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a duplicate name; that is the point
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in members:
                z.writestr(name, data)
    return path


def tar_member(name, data=b"", kind=tarfile.REGTYPE, mode=0o644, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def make_tar(path, members, mode="w:gz"):
    """`members`: tar_member(...) pairs, written as given (TarInfo names are not sanitized by addfile)."""
    with tarfile.open(path, mode) as t:
        for info, data in members:
            t.addfile(info, data)
    return path


def zip_info(name, mode):
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # Unix: external_attr's high 16 bits are st_mode
    info.external_attr = mode << 16
    return info


def refused(archive, member):
    """The message of a refusal of `member` of `archive`."""
    return rf"^{re.escape(str(archive))}: member {re.escape(repr(member))} .*: refused$"


# -- good archives --------------------------------------------------------------------------------------------------


def check_unpacked(dest):
    for name, data in FILES.items():
        path = dest / name
        assert path.read_bytes() == data, name
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, name
    files = sorted(
        os.path.relpath(os.path.join(root, f), dest).replace(os.sep, "/")
        for root, _, names in os.walk(dest)
        for f in names
    )
    assert files == sorted(FILES)


def test_a_good_zip_unpacks_with_identical_bytes_and_0644(dest, tmp_path):
    members = [(zip_info("model/", stat.S_IFDIR | 0o755), b""), (zip_info("model/sub/", stat.S_IFDIR | 0o700), b"")]
    # set-id and exec bits in the archive do not survive: every file comes out 0644
    members += [(zip_info(name, stat.S_IFREG | 0o4777), data) for name, data in FILES.items()]
    archive = make_zip(tmp_path / "src" / "good.zip", members)
    assert extract(archive, dest) is None
    check_unpacked(dest)
    assert outside(dest) == []
    assert model_root(str(dest), "options.json") == os.path.join(str(dest), "model")


def test_a_zip_member_without_a_unix_file_type_is_a_plain_file(dest, tmp_path):
    info = zipfile.ZipInfo("options.json")
    info.create_system, info.external_attr = 0, 0  # as written on Windows: no st_mode recorded
    archive = make_zip(tmp_path / "src" / "dos.zip", [(info, b"{}")])
    extract(archive, dest)
    assert (dest / "options.json").read_bytes() == b"{}"
    assert stat.S_IMODE((dest / "options.json").stat().st_mode) == 0o644


def test_a_good_tar_gz_with_nested_dirs_unpacks_with_identical_bytes_and_0644(dest, tmp_path):
    members = [
        tar_member("./", kind=tarfile.DIRTYPE, mode=0o755),  # `tar -C dir .` writes the directory itself first
        tar_member("model", kind=tarfile.DIRTYPE, mode=0o755),
        tar_member("model/sub", kind=tarfile.DIRTYPE, mode=0o755),
    ]
    members += [tar_member(name, data, mode=0o6755) for name, data in FILES.items()]
    archive = make_tar(tmp_path / "src" / "good.tar.gz", members)
    extract(archive, dest)
    check_unpacked(dest)
    assert outside(dest) == []
    assert model_root(str(dest), "weights.hdf5") == os.path.join(str(dest), "model")


def test_a_plain_tar_unpacks_too(dest, tmp_path):
    archive = make_tar(tmp_path / "src" / "good.tar", [tar_member(n, d) for n, d in FILES.items()], mode="w")
    extract(archive, dest)
    check_unpacked(dest)


# -- unsafe members: refused, nothing outside dest -------------------------------------------------------------------


def climbing_names(dest):
    """Names that leave `dest`: relative, absolute into dest's watched parent, and the literal /tmp/x."""
    return ["../evil", "a/../../evil", str(dest.parent / "abs_evil"), "/tmp/x"]


@pytest.mark.parametrize("index", range(4))
def test_a_zip_member_that_leaves_dest_is_refused(dest, tmp_path, index):
    name = climbing_names(dest)[index]
    tmp_x = os.path.exists("/tmp/x")
    archive = make_zip(tmp_path / "src" / "evil.zip", [("fine.txt", b"ok"), (name, b"pwned")])
    with pytest.raises(ArchiveError, match=refused(archive, name)) as e:
        extract(archive, dest)
    assert "leaves the archive's directory" in str(e.value) and e.value.path == archive
    assert outside(dest) == [] and os.listdir(dest) == []  # refused before a byte is written
    assert os.path.exists("/tmp/x") == tmp_x


@pytest.mark.parametrize("index", range(4))
def test_a_tar_member_that_leaves_dest_is_refused(dest, tmp_path, index):
    name = climbing_names(dest)[index]
    tmp_x = os.path.exists("/tmp/x")
    archive = make_tar(tmp_path / "src" / "evil.tar.gz", [tar_member("fine.txt", b"ok"), tar_member(name, b"pwned")])
    with pytest.raises(ArchiveError, match=refused(archive, name)) as e:
        extract(archive, dest)
    assert "leaves the archive's directory" in str(e.value)
    assert outside(dest) == [] and os.listdir(dest) == []
    assert os.path.exists("/tmp/x") == tmp_x


@pytest.mark.parametrize("name", ["..\\evil", "a\\..\\..\\evil", "C:\\evil", "C:/evil"])
def test_windows_style_names_in_a_zip_are_refused(dest, tmp_path, name):
    archive = make_zip(tmp_path / "src" / "win.zip", [(name, b"pwned")])
    assert zipfile.ZipFile(archive).namelist() == [name]  # zipfile keeps the backslashes on POSIX
    with pytest.raises(ArchiveError, match=refused(archive, name)):
        extract(archive, dest)
    assert outside(dest) == [] and os.listdir(dest) == []


@pytest.mark.parametrize("name", [".", "./."])
def test_a_zip_file_member_without_a_name_is_refused(dest, tmp_path, name):
    archive = make_zip(tmp_path / "src" / "noname.zip", [(zip_info(name, stat.S_IFREG | 0o644), b"x")])
    with pytest.raises(ArchiveError, match=refused(archive, name)) as e:
        extract(archive, dest)
    assert "has no name" in str(e.value)
    assert outside(dest) == [] and os.listdir(dest) == []


def test_a_zip_directory_member_for_dest_itself_is_skipped(dest, tmp_path):
    archive = make_zip(tmp_path / "src" / "dot.zip", [(zip_info("./", stat.S_IFDIR | 0o755), b""), ("a.txt", b"a")])
    extract(archive, dest)
    assert os.listdir(dest) == ["a.txt"] and outside(dest) == []


@pytest.mark.parametrize("kind", [stat.S_IFLNK, stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK])
def test_a_zip_link_or_special_member_is_refused(dest, tmp_path, kind):
    members = [("fine.txt", b"ok"), (zip_info("link", kind | 0o777), b"../../etc/passwd")]
    archive = make_zip(tmp_path / "src" / "link.zip", members)
    with pytest.raises(ArchiveError, match=refused(archive, "link")) as e:
        extract(archive, dest)
    assert "is a link or a special file" in str(e.value)
    assert outside(dest) == [] and os.listdir(dest) == []


def test_the_symlink_attr_of_the_brief_is_refused(dest, tmp_path):
    info = zipfile.ZipInfo("model/options.json")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = make_zip(tmp_path / "src" / "symlink.zip", [(info, b"/etc/passwd")])
    with pytest.raises(ArchiveError, match=refused(archive, "model/options.json")):
        extract(archive, dest)
    assert outside(dest) == [] and os.listdir(dest) == []


@pytest.mark.parametrize(
    "member",
    [
        dict(kind=tarfile.SYMTYPE, linkname="../../etc/passwd"),
        dict(kind=tarfile.SYMTYPE, linkname="options.json"),  # even one pointing inside
        dict(kind=tarfile.LNKTYPE, linkname="fine.txt"),
        dict(kind=tarfile.LNKTYPE, linkname="/etc/passwd"),
        dict(kind=tarfile.FIFOTYPE),
        dict(kind=tarfile.CHRTYPE),
        dict(kind=tarfile.BLKTYPE),
    ],
    ids=["symlink-out", "symlink-in", "hardlink", "hardlink-abs", "fifo", "chardev", "blockdev"],
)
def test_a_tar_link_or_special_member_is_refused(dest, tmp_path, member):
    archive = make_tar(tmp_path / "src" / "link.tar.gz", [tar_member("fine.txt", b"ok"), tar_member("bad", **member)])
    with pytest.raises(ArchiveError, match=refused(archive, "bad")) as e:
        extract(archive, dest)
    assert "is a link or a special file" in str(e.value)
    assert outside(dest) == [] and os.listdir(dest) == []


def test_more_members_than_max_members_are_refused(dest, tmp_path):
    archive = make_zip(tmp_path / "src" / "many.zip", [(f"f{i}", b"x") for i in range(4)])
    extract(archive, dest, max_members=4)  # the bound itself is fine
    assert sorted(os.listdir(dest)) == ["f0", "f1", "f2", "f3"]
    (tmp_path / "out" / "dest2").mkdir()
    archive = make_zip(tmp_path / "src" / "many2.zip", [(f"f{i}", b"x") for i in range(5)])
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: 5 members, more than 4: refused$"):
        extract(archive, tmp_path / "out" / "dest2", max_members=4)
    assert os.listdir(tmp_path / "out" / "dest2") == []


def test_more_tar_members_than_max_members_are_refused(dest, tmp_path):
    archive = make_tar(tmp_path / "src" / "many.tar.gz", [tar_member(f"f{i}", b"x") for i in range(5)])
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: 5 members, more than 4: refused$"):
        extract(archive, dest, max_members=4)
    assert outside(dest) == [] and os.listdir(dest) == []


@pytest.mark.parametrize("suffix", ["zip", "tar.gz"])
def test_declared_sizes_over_max_bytes_are_refused(dest, tmp_path, suffix):
    members = [("a", b"x" * 600), ("b", b"y" * 600)]
    path = tmp_path / "src" / f"big.{suffix}"
    archive = make_zip(path, members) if suffix == "zip" else make_tar(path, [tar_member(n, d) for n, d in members])
    message = rf"^{re.escape(str(archive))}: declares 1200 unpacked bytes, more than the bound of 1000: refused$"
    with pytest.raises(ArchiveError, match=message):
        extract(archive, dest, max_bytes=1000)
    assert outside(dest) == []
    assert written(dest) <= 1000


@pytest.mark.parametrize("suffix", ["zip", "tar.gz"])
@pytest.mark.parametrize("names", [("a.txt", "a.txt"), ("a.txt", "./a.txt"), ("d/a.txt", "d//a.txt")])
def test_a_member_that_repeats_a_name_is_refused(dest, tmp_path, suffix, names):
    path = tmp_path / "src" / f"twice.{suffix}"
    members = [(names[0], b"first"), (names[1], b"second")]
    archive = make_zip(path, members) if suffix == "zip" else make_tar(path, [tar_member(n, d) for n, d in members])
    # the message names the second member as the archive spells it
    message = rf"^{re.escape(str(archive))}: member {re.escape(repr(names[1]))} collides with another member of the "
    with pytest.raises(ArchiveError, match=message + "same path: refused$"):
        extract(archive, dest)
    assert (dest / names[0]).read_bytes() == b"first"  # the first is never overwritten by the second
    assert outside(dest) == []


@pytest.mark.parametrize("suffix", ["zip", "tar.gz"])
def test_a_file_member_then_members_under_it_is_refused(dest, tmp_path, suffix):
    """`a` as a file, then `a/b/c`: `a` cannot be a directory too; the error is an ArchiveError, not an OSError."""
    path = tmp_path / "src" / f"clash.{suffix}"
    members = [("a", b"file"), ("a/b/c", b"under")]
    archive = make_zip(path, members) if suffix == "zip" else make_tar(path, [tar_member(n, d) for n, d in members])
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: "):
        extract(archive, dest)
    assert outside(dest) == []


# -- zip bombs ------------------------------------------------------------------------------------------------------

ZEROS = 5_000_000


def test_a_zip_bomb_declaring_its_size_is_refused_before_writing(dest, tmp_path):
    archive = make_zip(tmp_path / "src" / "bomb.zip", [("zeros.bin", bytes(ZEROS))])
    assert os.path.getsize(archive) < 20_000  # highly compressible: the archive is small
    message = rf"^{re.escape(str(archive))}: declares {ZEROS} unpacked bytes, more than the bound of 1000000: refused$"
    with pytest.raises(ArchiveError, match=message):
        extract(archive, dest, max_bytes=1_000_000)
    assert written(dest) == 0 and outside(dest) == []


def test_a_zip_bomb_lying_about_its_size_stops_within_max_bytes(dest, tmp_path):
    """The central directory and the local header say 1000 bytes; the deflate stream holds 5 MB of zeros."""
    raw = bytearray(make_zip(tmp_path / "src" / "bomb.zip", [("zeros.bin", bytes(ZEROS))]).read_bytes())
    local, central = raw.index(b"PK\x03\x04"), raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, local + 22, 1000)  # uncompressed size in the local header
    struct.pack_into("<I", raw, central + 24, 1000)  # and in the central directory
    archive = tmp_path / "src" / "liar.zip"
    archive.write_bytes(bytes(raw))
    assert zipfile.ZipFile(archive).getinfo("zeros.bin").file_size == 1000
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: ") as e:
        extract(archive, dest, max_bytes=100_000)
    assert "\n" not in str(e.value)
    assert written(dest) <= 100_000 and outside(dest) == []


# -- not an archive, broken archives ---------------------------------------------------------------------------------


def test_a_file_that_is_neither_zip_nor_tar_is_refused(dest, tmp_path):
    archive = tmp_path / "src" / "weights.hdf5"
    archive.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(2000))
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: neither a zip nor a tar archive$") as e:
        extract(archive, dest)
    assert e.value.path == archive
    assert os.listdir(dest) == []


def test_a_missing_archive_is_an_archive_error(dest, tmp_path):
    archive = tmp_path / "src" / "absent.zip"
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: not a readable archive: .*No such file"):
        extract(archive, dest)


def good_tar_gz(tmp_path):
    data = os.urandom(100_000)  # incompressible: the .tar.gz is about as long as the data
    return make_tar(tmp_path / "src" / "whole.tar.gz", [tar_member("model/w.bin", data)]).read_bytes()


@pytest.mark.parametrize(
    "cut",
    [
        lambda raw: raw[: len(raw) // 2],  # in the middle of the member's data
        lambda raw: raw[:600],  # just past the first header
        lambda raw: raw[:60],  # inside the gzip stream, before the first tar header is complete
        lambda raw: raw[:-8],  # the gzip trailer (CRC-32, length) missing
    ],
    ids=["half", "600-bytes", "60-bytes", "no-gzip-trailer"],
)
def test_a_truncated_tar_gz_is_an_archive_error_of_one_line(dest, tmp_path, cut):
    archive = tmp_path / "src" / "cut.tar.gz"
    archive.write_bytes(cut(good_tar_gz(tmp_path)))
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: ") as e:
        extract(archive, dest)
    assert "\n" not in str(e.value) and e.value.path == archive
    assert outside(dest) == []


def test_a_corrupted_tar_gz_is_an_archive_error(dest, tmp_path):
    """One bit flipped in the compressed data: gzip's CRC-32 says so (`gzip.decompress` raises), so must extract."""
    raw = bytearray(good_tar_gz(tmp_path))
    raw[50_000] ^= 0x01  # inside the stored (incompressible) deflate block: the stream still decodes
    archive = tmp_path / "src" / "corrupt.tar.gz"
    archive.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: "):
        extract(archive, dest)


def test_a_truncated_zip_is_an_archive_error(dest, tmp_path):
    raw = make_zip(tmp_path / "src" / "whole.zip", [("w.bin", os.urandom(50_000))]).read_bytes()
    archive = tmp_path / "src" / "cut.zip"
    archive.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: "):
        extract(archive, dest)


# -- model_root ------------------------------------------------------------------------------------------------------


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_model_root_finds_the_marker_at_the_top(tmp_path):
    touch(tmp_path / "options.json")
    touch(tmp_path / "weights.hdf5")
    assert model_root(str(tmp_path), "options.json") == str(tmp_path)


def test_model_root_finds_the_marker_one_level_down(tmp_path):
    touch(tmp_path / "elmo_model" / "options.json")
    touch(tmp_path / "README")
    assert model_root(str(tmp_path), "options.json") == os.path.join(str(tmp_path), "elmo_model")


def test_model_root_is_none_when_two_dirs_hold_the_marker(tmp_path):
    touch(tmp_path / "a" / "options.json")
    touch(tmp_path / "b" / "options.json")
    assert model_root(str(tmp_path), "options.json") is None


def test_model_root_is_none_when_the_top_and_a_subdir_hold_the_marker(tmp_path):
    touch(tmp_path / "options.json")
    touch(tmp_path / "old" / "options.json")
    assert model_root(str(tmp_path), "options.json") is None


def test_model_root_is_none_without_the_marker(tmp_path):
    touch(tmp_path / "model" / "config.json")
    assert model_root(str(tmp_path), "options.json") is None


def test_model_root_skips_macosx(tmp_path):
    touch(tmp_path / "model" / "options.json")
    touch(tmp_path / "__MACOSX" / "model" / "options.json")  # macOS Archive Utility's resource-fork shadows
    touch(tmp_path / "__MACOSX" / "options.json")
    assert model_root(str(tmp_path), "options.json") == os.path.join(str(tmp_path), "model")


# -- what follows the end of a tar archive, and headers that ask for memory -------------------------------------------


def tar_bytes(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as t:  # ends with two zero blocks, padded to 10240-byte records
        for info, data in members:
            t.addfile(info, data)
    return buffer.getvalue()


def compressed(raw, suffix):
    import bz2
    import gzip
    import lzma

    return {".tar": lambda b: b, ".tar.gz": gzip.compress, ".tar.bz2": bz2.compress, ".tar.xz": lzma.compress}[suffix](
        raw
    )


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.bz2", ".tar.xz", ".tar"])
def test_zeros_after_the_end_of_a_tar_count_against_the_bound(dest, tmp_path, suffix):
    """Megabytes of zeros after the end-of-archive blocks (gigabytes in the review: unbounded CPU) stop at the bound
    (the time it costs: test_the_default_bound_on_trailing_zeros_is_cheap)."""
    raw = tar_bytes([tar_member("model/w.bin", b"x" * 1000)])
    archive = tmp_path / "src" / f"padded{suffix}"
    archive.write_bytes(compressed(raw + bytes(4 << 20), suffix))
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: .*after the end of the tar archive") as e:
        extract(archive, dest, max_bytes=100_000)
    assert "\n" not in str(e.value) and e.value.path == archive
    assert outside(dest) == []


def test_zeros_after_the_end_within_the_bound_are_the_tars_padding(dest, tmp_path):
    raw = tar_bytes([tar_member("model/w.bin", b"x" * 1000)])
    archive = tmp_path / "src" / "padded.tar.gz"
    archive.write_bytes(compressed(raw + bytes(30_000), ".tar.gz"))
    extract(archive, dest, max_bytes=100_000)
    assert (dest / "model" / "w.bin").read_bytes() == b"x" * 1000


def test_the_default_bound_on_trailing_zeros_is_cheap(dest, tmp_path):
    """The trailing zeros also have their own small bound, so that the default 8 GiB bound is not what a few
    megabytes of gzip'd zeros cost."""
    from elmo_tf.presets.archive import MAX_TRAILING_BYTES

    raw = tar_bytes([tar_member("model/w.bin", b"x" * 1000)])
    archive = tmp_path / "src" / "padded.tar.gz"
    archive.write_bytes(compressed(raw + bytes(MAX_TRAILING_BYTES + (4 << 20)), ".tar.gz"))
    start = time.process_time()
    with pytest.raises(ArchiveError, match="after the end of the tar archive"):
        extract(archive, dest)
    assert time.process_time() - start < 2.0


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar"])
def test_data_after_the_end_of_a_tar_is_refused(dest, tmp_path, suffix):
    raw = tar_bytes([tar_member("model/w.bin", b"x" * 1000)])
    archive = tmp_path / "src" / f"trailing{suffix}"
    archive.write_bytes(compressed(raw + b"hidden payload" + bytes(1000), suffix))
    with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: data after the end of the tar archive"):
        extract(archive, dest)
    assert outside(dest) == []


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE])
def test_a_header_whose_data_is_huge_is_refused_before_it_is_read(dest, tmp_path, kind):
    """A GNU long name or a pax header declaring gigabytes: tarfile reads a header's data whole into memory (here
    32 MB of the 3 GiB declared are there: what is allocated shows whether it was read)."""
    import tracemalloc

    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = kind, 3 << 30
    block = header.tobuf(format=tarfile.GNU_FORMAT if kind == tarfile.GNUTYPE_LONGNAME else tarfile.USTAR_FORMAT)
    archive = tmp_path / "src" / "long.tar.gz"
    archive.write_bytes(compressed(block + bytes(32 << 20), ".tar.gz"))
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError, match=rf"^{re.escape(str(archive))}: "):
            extract(archive, dest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
