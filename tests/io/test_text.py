"""elmo_tf/io/text.py: line numbers and byte offsets, line ends, byte order marks, NUL bytes."""

import codecs

import pytest

from elmo_tf.io.text import TextFileError, count_lines, iter_lines, raw_lines, read_text


def write(tmp_path, data, name="f.txt"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_raw_lines_numbers_offsets_and_line_ends(tmp_path):
    data = b"a b\r\n\ncaf\xe9\n  \r\nlast"
    path = write(tmp_path, data)
    rows = list(raw_lines(path))
    assert rows == [(1, 0, b"a b"), (2, 5, b""), (3, 6, b"caf\xe9"), (4, 11, b"  "), (5, 15, b"last")]
    for _, offset, line in rows:
        assert data[offset : offset + len(line)] == line


def test_a_utf8_bom_is_skipped_and_offsets_stay_file_offsets(tmp_path):
    path = write(tmp_path, codecs.BOM_UTF8 + "é x\ny\n".encode())
    assert list(iter_lines(path)) == [(1, "é x"), (2, "y")]
    assert list(raw_lines(path))[0][1] == 3
    assert read_text(path) == "é x\ny\n"


def test_iter_lines_rejects_invalid_utf8_with_line_and_offset(tmp_path):
    path = write(tmp_path, b"ok\nstill ok\nbad \xc3(\n")
    with pytest.raises(TextFileError, match=r":3: invalid UTF-8 \(byte 0xc3 at byte offset 16\)$"):
        list(iter_lines(path))


@pytest.mark.parametrize(
    "data,line,needle",
    [
        ("x\ny\n".encode("utf-16"), 1, "UTF-16/UTF-32 byte order mark"),
        ("x\ny\n".encode("utf-16-be"), 1, "NUL byte at byte offset 0"),
        ("x\ny\n".encode("utf-16-le"), 1, "NUL byte at byte offset 1"),
        (b"x\ny\x00\n", 2, "NUL byte at byte offset 3"),
    ],
    ids=["utf16-bom", "utf16-be", "utf16-le", "nul"],
)
def test_wide_and_binary_files_are_not_text(tmp_path, data, line, needle):
    path = write(tmp_path, data)
    for read in (lambda p: list(raw_lines(p)), count_lines):
        with pytest.raises(TextFileError) as info:
            read(path)
        assert str(info.value).startswith(f"{path}:{line}: ") and needle in str(info.value)


def test_count_lines_allows_invalid_utf8_and_counts_token_lines(tmp_path):
    assert count_lines(write(tmp_path, b"a\n\n \t\ncaf\xe9\nlast")) == (5, 2 + 1)
    assert count_lines(write(tmp_path, b"")) == (0, 0)
    assert count_lines(write(tmp_path, b"\n")) == (1, 0)


def test_missing_files_and_directories(tmp_path):
    with pytest.raises(TextFileError, match="is a directory"):
        count_lines(tmp_path)
    with pytest.raises(TextFileError, match="nope.txt: No such file or directory$"):
        read_text(tmp_path / "nope.txt")
