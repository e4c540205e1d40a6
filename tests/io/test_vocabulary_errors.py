"""elmo_tf/io/vocabulary.py: vocabulary and corpus files that are not UTF-8 text raise errors naming the file and
the line; byte order marks and CRLF are not part of words; `Vocabulary.save` is atomic."""

import codecs
import logging

import pytest

from elmo_tf.io.vocabulary import CorpusError, Vocabulary, VocabularyError, count_words, expand_glob

WORDS = ["<S>", "</S>", "<UNK>", "the", "cat"]


def load_error(path):
    with pytest.raises(VocabularyError) as info:
        Vocabulary.load(path)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    return str(info.value)


def test_load_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "vocab.txt"
    assert load_error(path) == f"cannot read vocabulary {path}: No such file or directory"
    assert load_error(tmp_path) == f"cannot read vocabulary {tmp_path}: is a directory, not a file"
    path.write_bytes("\n".join(WORDS).encode("utf-16"))
    assert load_error(path).startswith(f"cannot read vocabulary {path}:1: starts with a UTF-16/UTF-32 byte order mark")
    path.write_bytes(b"<S>\n</S>\n<UNK>\ncaf\xe9\n")
    assert load_error(path) == f"cannot read vocabulary {path}:4: invalid UTF-8 (byte 0xe9 at byte offset 18)"
    path.write_text("<S>\n</S>\n<UNK>\nthe\ncat\n\nthe\n")
    assert load_error(path) == f"{path}:7: duplicate word 'the' (first on line 4)"
    path.write_text("\n\n")
    assert load_error(path) == f"{path}: the vocabulary is empty (expected one word per line)"


def test_bom_and_crlf_are_not_part_of_words(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(codecs.BOM_UTF8 + "\r\n".join(WORDS).encode() + b"\r\n")
    assert Vocabulary.load(path).words == WORDS
    path.write_bytes(codecs.BOM_UTF8 + b"the\ncat\n")  # specials missing: put in front
    assert Vocabulary.load(path).words == WORDS


def test_save_is_atomic_and_removes_stale_temporaries(tmp_path):
    path = tmp_path / "vocab.txt"
    (tmp_path / ".vocab.txt.tmp-999999999-00000000").write_text("half")
    Vocabulary(WORDS).save(path)
    assert path.read_text() == "\n".join(WORDS) + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.txt"]


def test_count_words_rejects_files_that_are_not_text(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("the cat\n".encode("utf-16-le"))
    with pytest.raises(CorpusError, match=rf"^{path}:1: NUL byte at byte offset 1: not a UTF-8 text file"):
        count_words([path])
    with pytest.raises(CorpusError, match="is a directory"):
        count_words([tmp_path])


def test_count_words_replaces_invalid_utf8_with_a_warning(tmp_path, caplog):
    path = tmp_path / "corpus.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"the cat\r\ncaf\xe9 the\n")
    with caplog.at_level(logging.WARNING, logger="elmo_tf.io.vocabulary"):
        counts = count_words([path])
    assert counts == {"the": 2, "cat": 1, "caf\ufffd": 1}
    assert [r.getMessage() for r in caplog.records] == [
        f"invalid UTF-8 on 1 line(s), replaced by U+FFFD; the first: {path}:2: invalid UTF-8 (byte 0xe9 at byte "
        "offset 15)"
    ]


def test_expand_glob_of_a_directory_suggests_a_glob(tmp_path):
    with pytest.raises(ValueError, match=r"is a directory: give a glob of its files, e\.g\. '.*/\*\.txt'"):
        expand_glob(str(tmp_path))
    with pytest.raises(ValueError, match="no files match"):
        expand_glob(str(tmp_path / "*.txt"))
