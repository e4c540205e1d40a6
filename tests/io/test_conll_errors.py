"""elmo_tf/io/conll.py: files in the wrong encoding, byte order marks, CRLF, directories -> `ConllFormatError`
naming the file and line (and the byte offset), never a UnicodeDecodeError or OSError."""

import codecs

import pytest

from elmo_tf.io.conll import ConllFormatError, read_conll

TEXT = "-DOCSTART- -X- O O\n\nJohn NNP B-NP I-PER\nZürich NNP I-NP I-LOC\n\nvisited VBD B-VP O\n"
EXPECTED = [(["John", "Zürich"], ["I-PER", "I-LOC"], 3), (["visited"], ["O"], 6)]


def parsed(path):
    return [(s.tokens, s.tags, s.line) for s in read_conll(path)]


def conll_error(path, **kwargs):
    with pytest.raises(ConllFormatError) as info:
        read_conll(path, **kwargs)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    path = tmp_path / "latin1.conll"
    data = "John B-PER\n\nna\xefve O\ncaf\xe9 O\n".encode("latin-1")
    path.write_bytes(data)
    message = conll_error(path)
    offset = data.index(b"\xef")
    assert message.startswith(f"{path}:3: ") and "invalid UTF-8" in message
    assert f"byte 0xef at byte offset {offset}" in message


def test_invalid_utf8_offset_counts_a_skipped_bom(tmp_path):
    path = tmp_path / "bom_then_bad.conll"
    data = codecs.BOM_UTF8 + b"a O\nb\xff O\n"
    path.write_bytes(data)
    offset = data.index(b"\xff")
    assert f"{path}:2: invalid UTF-8 (byte 0xff at byte offset {offset})" in conll_error(path)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_are_rejected_on_line_1(tmp_path, encoding):
    path = tmp_path / f"{encoding}.conll"
    path.write_bytes(TEXT.encode(encoding))  # utf-16 / utf-32 write a byte order mark; utf-16-be does not
    message = conll_error(path)
    assert message.startswith(f"{path}:1: ")
    assert "UTF-16" in message and "UTF-8" in message


def test_a_nul_byte_in_the_middle_names_its_line(tmp_path):
    path = tmp_path / "binary.conll"
    path.write_bytes(b"a O\nb O\n\nc\x00 O\n")
    message = conll_error(path)
    assert message.startswith(f"{path}:4: ") and "NUL byte at byte offset 10" in message


def test_utf8_bom_is_skipped_silently(tmp_path):
    path = tmp_path / "bom.conll"
    path.write_bytes(codecs.BOM_UTF8 + TEXT.encode("utf-8"))
    assert parsed(path) == EXPECTED
    path.write_bytes(codecs.BOM_UTF8 + b"John B-PER\n")  # the BOM before a token, not before -DOCSTART-
    assert parsed(path) == [(["John"], ["B-PER"], 1)]


def test_crlf_line_endings_are_accepted(tmp_path):
    path = tmp_path / "crlf.conll"
    path.write_bytes(TEXT.replace("\n", "\r\n").encode("utf-8"))
    assert parsed(path) == EXPECTED
    path.write_bytes(b"x\tB-person\r\n\t\r\ny\tO\r\n")  # WNUT-style tab columns and a tab-only break
    assert parsed(path) == [(["x"], ["B-person"], 1), (["y"], ["O"], 3)]


def test_a_directory_and_a_missing_file(tmp_path):
    message = conll_error(tmp_path)
    assert message == f"{tmp_path}: is a directory, not a file"
    message = conll_error(tmp_path / "missing.conll")
    assert message == f"{tmp_path / 'missing.conll'}: No such file or directory"


@pytest.mark.parametrize("data", [b"", codecs.BOM_UTF8, b"\r\n\r\n"], ids=["empty", "bom-only", "blank-crlf"])
def test_files_without_sentences(tmp_path, data):
    path = tmp_path / "empty.conll"
    path.write_bytes(data)
    assert conll_error(path) == f"{path}: no sentences found"


def test_a_column_out_of_range_names_the_line(tmp_path):
    path = tmp_path / "two.conll"
    path.write_text("a B-PER\nb O\n", encoding="utf-8")
    message = conll_error(path, tag_column=3)
    assert message.startswith(f"{path}:1: ") and "column" in message
