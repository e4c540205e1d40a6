"""training/build_vocab.py with careless input: one error line naming the flag and the file (and the line),
exit 2 for usage errors, 1 for data errors, no traceback; the output is written atomically, stale temporaries of
a killed run are removed, and a failed run leaves an existing vocabulary as it was."""

import os

import pytest
from cli_testlib import REPO_ROOT, assert_one_error, own_lines, run_command

SCRIPT = REPO_ROOT / "training" / "build_vocab.py"
PROG = "build_vocab.py: error:"


def build_vocab(*args):
    return run_command([SCRIPT, *args])


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("the cat sat\nthe dog\n", encoding="utf-8")
    (d / "b.txt").write_text("a cat\n", encoding="utf-8")
    return d


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--min-count", "0", "--min-count must be >= 1, got '0'"),
        ("--min-count", "-2", "--min-count must be >= 1, got '-2'"),
        ("--min-count", "nan", "--min-count must be an integer, got 'nan'"),
        ("--max-size", "3", "--max-size must be > 3, got '3'"),
        ("--max-size", "ten", "--max-size must be an integer, got 'ten'"),
    ],
)
def test_bad_numbers(corpus, tmp_path, flag, value, needle):
    out = tmp_path / "vocab.txt"
    assert_one_error(build_vocab("--train", corpus / "*.txt", "--output", out, flag, value), 2, PROG, needle)
    assert not out.exists()


def test_train_is_a_directory(corpus, tmp_path):
    result = build_vocab("--train", corpus, "--output", tmp_path / "vocab.txt")
    assert_one_error(result, 2, PROG, f"--train: '{corpus}' is a directory: give a glob", "*.txt")


def test_output_is_one_of_the_training_files(corpus):
    before = (corpus / "a.txt").read_text()
    line = assert_one_error(build_vocab("--train", corpus / "*.txt", "--output", corpus / "a.txt"), 2, PROG)
    assert "--output" in line and "same file as --train" in line and "a.txt" in line
    link = corpus.parent / "vocab.txt"
    link.symlink_to(corpus / "b.txt")
    assert_one_error(build_vocab("--train", corpus / "*.txt", "--output", link), 2, "same file as --train")
    assert (corpus / "a.txt").read_text() == before and link.is_symlink()


def test_output_directory_missing_or_a_directory(corpus, tmp_path):
    missing = tmp_path / "nope" / "vocab.txt"
    result = build_vocab("--train", corpus / "*.txt", "--output", missing)
    assert_one_error(result, 2, PROG, "--output: the directory", "does not exist")
    assert_one_error(build_vocab("--train", corpus / "*.txt", "--output", tmp_path), 2, "--output: is a directory")


@pytest.mark.parametrize(
    "data,needle",
    [
        ("the cat\n".encode("utf-16"), "b.txt:1: starts with a UTF-16/UTF-32 byte order mark"),
        (b"ok\nbin\x00ary\n", "b.txt:2: NUL byte at byte offset 6"),
    ],
    ids=["utf16", "nul"],
)
def test_a_file_that_is_not_text(corpus, tmp_path, data, needle):
    (corpus / "b.txt").write_bytes(data)
    out = tmp_path / "vocab.txt"
    out.write_text("<S>\n</S>\n<UNK>\nold\n")
    assert_one_error(build_vocab("--train", corpus / "*.txt", "--output", out), 1, PROG, f"--train: {corpus}", needle)
    assert out.read_text() == "<S>\n</S>\n<UNK>\nold\n"  # a failed run does not touch the old vocabulary


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b"\n \t\n\r\n")
    result = build_vocab("--train", tmp_path / "*.txt", "--output", tmp_path / "vocab.out")
    assert_one_error(result, 1, PROG, "--train: no words in the 2 file(s) matching", "*.txt")
    assert not (tmp_path / "vocab.out").exists()


def test_latin1_is_counted_with_a_warning_naming_the_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("ok\ncafé ok\nnaïve\n".encode("latin-1"))
    result = build_vocab("--train", corpus, "--output", tmp_path / "vocab.txt")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in own_lines(result.stderr) if line.startswith("WARNING")]
    assert len(warnings) == 1 and "invalid UTF-8 on 2 line(s)" in warnings[0], result.stderr
    assert f"{corpus}:2: invalid UTF-8 (byte 0xe9 at byte offset 6)" in warnings[0]


def test_a_utf8_bom_and_crlf_are_not_part_of_words(tmp_path):
    corpus = tmp_path / "bom.txt"
    corpus.write_bytes(b"\xef\xbb\xbfthe cat\r\nthe\r\n")
    out = tmp_path / "vocab.txt"
    assert build_vocab("--train", corpus, "--output", out).returncode == 0
    assert out.read_text(encoding="utf-8").splitlines() == ["<S>", "</S>", "<UNK>", "the", "cat"]


def test_stale_temporaries_of_a_killed_run_are_removed(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    stale = tmp_path / ".vocab.txt.tmp-999999999-0badf00d"  # no process has this id
    stale.write_text("half a vocabulary")
    live = tmp_path / f".vocab.txt.tmp-{os.getpid()}-0badf00d"  # a running writer's: kept
    live.write_text("being written")
    result = build_vocab("--train", corpus / "*.txt", "--output", out)
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and live.exists()
    assert out.read_text().splitlines()[:4] == ["<S>", "</S>", "<UNK>", "cat"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["corpus", "vocab.txt", live.name])


def test_an_unquoted_glob_expanded_by_the_shell(corpus, tmp_path):
    result = build_vocab("--train", corpus / "a.txt", corpus / "b.txt", "--output", tmp_path / "vocab.txt")
    assert_one_error(result, 2, PROG, "unrecognized arguments", "b.txt")
    assert not (tmp_path / "vocab.txt").exists()


def test_output_named_like_a_directory(corpus, tmp_path):
    result = build_vocab("--train", corpus / "*.txt", "--output", f"{tmp_path / 'vocabs'}{os.sep}")
    assert_one_error(result, 2, PROG, "--output", "ends with a separator")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
