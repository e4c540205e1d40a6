"""Every command with an output it cannot write (issue 49): in a missing directory, under a regular file used as a
directory, in a read-only directory, an output that is a directory (a file output) or a file (a directory output),
a read-only file. Each answers with ONE true line naming --output, exit 2, no traceback, before any work; nothing is
written.

Run in process (`elmo_tf.cli.main.main`): these checks come before TensorFlow is imported. A read-only directory or
file is made with chmod where the tests do not run as root (root writes anyway); as root, `os.access` is made to say
what chmod would, for that path only.
"""

import os

import pytest

from elmo_tf.cli.main import main

FILE_OUTPUTS = {  # command -> its arguments but --output (files created in the test's directory)
    "embed": ["--options", "F", "--weights", "F", "--input", "F"],
    "score": ["--options", "F", "--weights", "F", "--softmax", "F", "--vocab", "F", "--input", "F"],
    "dump-token-embeddings": ["--options", "F", "--weights", "F", "--vocab", "F"],
    "build-vocab": ["--train", "F"],
}
DIR_OUTPUTS = {
    "export": ["--options", "F", "--weights", "F"],
    "export-tagger": ["--ner", "NER"],
    "pretrain": ["--train", "F", "--vocab", "F", "--config", "small", "--steps", "1"],
    "train-ner": ["--train", "F", "--dev", "F", "--test", "F", "--no-elmo"],
    "convert": ["--from", "bilm-tf-checkpoint", "SRC"],
}
# case -> (the output, relative to the test's directory, what the line says)
FILE_CASES = {
    "missing-directory": ("nope/out.x", "does not exist"),
    "under-a-file": ("F/out.x", "is not a directory"),
    "read-only-directory": ("ro/out.x", "is not writable"),
    "a-directory": ("dir", "is a directory"),
    "read-only-file": ("ro-file.x", "is read-only"),
}
DIR_CASES = {
    "under-a-file": ("F/out", "is not a writable directory"),
    "read-only-directory": ("ro/out", "is not a writable directory"),
    "a-file": ("F", "not a directory"),
}


@pytest.fixture
def place(tmp_path, monkeypatch):
    """The test's directory: F (a small text file), dir/, ro/ (read-only), ro-file.x (read-only), SRC/, NER/."""
    (tmp_path / "F").write_text("a b c\nd e\n")
    for name in ("dir", "ro", "SRC", "NER"):
        (tmp_path / name).mkdir()
    (tmp_path / "ro-file.x").write_text("kept\n")
    from elmo_tf.ner.tagging import MODEL_FILES

    for name in MODEL_FILES:  # what export-tagger checks --ner holds before --output
        (tmp_path / "NER" / name).write_text("")
    read_only = {str(tmp_path / "ro"), str(tmp_path / "ro-file.x")}
    if os.geteuid() == 0:
        real = os.access

        def access(path, mode, **kwargs):
            if os.path.abspath(path) in read_only and mode & os.W_OK:
                return False
            return real(path, mode, **kwargs)

        monkeypatch.setattr(os, "access", access)
    else:
        os.chmod(tmp_path / "ro", 0o555)
        os.chmod(tmp_path / "ro-file.x", 0o444)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    os.chmod(tmp_path / "ro", 0o755)


def cases(commands, kinds):
    return [pytest.param(c, k, id=f"{c}-{k}") for c in commands for k in kinds]


def check(place, capsys, command, args, output, needle):
    before = sorted(p.relative_to(place) for p in place.rglob("*"))
    status = main([command, *args, "--output", output])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and "error: --output" in lines[0], err
    assert needle in lines[0], (needle, lines[0])
    assert sorted(p.relative_to(place) for p in place.rglob("*")) == before  # nothing written
    assert (place / "ro-file.x").read_text() == "kept\n"


@pytest.mark.parametrize("command,case", cases(FILE_OUTPUTS, FILE_CASES))
def test_a_file_output_that_cannot_be_written_is_one_true_line(place, capsys, command, case):
    output, needle = FILE_CASES[case]
    check(place, capsys, command, FILE_OUTPUTS[command], output, needle)


@pytest.mark.parametrize("command,case", cases(DIR_OUTPUTS, DIR_CASES))
def test_a_directory_output_that_cannot_be_written_is_one_true_line(place, capsys, command, case):
    output, needle = DIR_CASES[case]
    check(place, capsys, command, DIR_OUTPUTS[command], output, needle)
