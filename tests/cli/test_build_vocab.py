"""training/build_vocab.py: specials first, then words by decreasing frequency; --min-count, --max-size;
a glob that matches nothing exits 2 naming --train."""

import os
import sys
from pathlib import Path

import forked
import pytest
from cli_testlib import assert_ends_with_one_error, run_limited

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "training" / "build_vocab.py"

# counts: the 5, a 4, cat 3, dog 3 (tie: alphabetical), sat 2, on 1, mat 1; "<S>" in the text is not
# counted twice; split over two files so the glob really has to match both.
FILE_A = "the cat sat\nthe dog <S>\n\n   \na cat\n"
FILE_B = "the a a dog\n\tthe a cat dog sat on\nthe mat\n"
EXPECTED = ["<S>", "</S>", "<UNK>", "the", "a", "cat", "dog", "sat", "mat", "on"]


def run_build_vocab(*args, timeout=120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return forked.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text(FILE_A)
    (d / "b.txt").write_text(FILE_B)
    (d / "skip.md").write_text("zebra zebra zebra zebra zebra zebra\n")  # not matched by the glob
    return d


def read_vocab(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_specials_then_decreasing_frequency(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    proc = run_build_vocab("--train", corpus / "*.txt", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert read_vocab(out) == EXPECTED


def test_min_count_drops_rare_words(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    proc = run_build_vocab("--train", corpus / "*.txt", "--output", out, "--min-count", 3)
    assert proc.returncode == 0, proc.stderr
    assert read_vocab(out) == ["<S>", "</S>", "<UNK>", "the", "a", "cat", "dog"]


def test_max_size_counts_the_specials(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    proc = run_build_vocab("--train", corpus / "*.txt", "--output", out, "--max-size", 6)
    assert proc.returncode == 0, proc.stderr
    assert read_vocab(out) == EXPECTED[:6]


def test_invalid_utf8_is_counted_not_fatal(tmp_path):
    corpus = tmp_path / "bytes.txt"
    corpus.write_bytes(b"caf\xe9 caf\xe9 ok\nok ok\n")
    out = tmp_path / "vocab.txt"
    proc = run_build_vocab("--train", corpus, "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert read_vocab(out) == ["<S>", "</S>", "<UNK>", "ok", "caf\ufffd"]


def test_a_full_disk_keeps_the_old_vocabulary(tmp_path):
    """A vocabulary the disk refuses (a file-size limit: EFBIG, as a full disk gives ENOSPC): exit 1, one line naming
    the output and the error, the old file byte for byte, no temporary."""
    (tmp_path / "big.txt").write_text(" ".join(f"word{k}" for k in range(5000)) + "\n")  # a 48 kB vocabulary
    output = tmp_path / "vocab.txt"
    output.write_text("an older vocabulary\n")
    result = run_limited([SCRIPT, "--train", tmp_path / "big.txt", "--output", output], 16 * 1024, timeout=120)
    assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(output)!r}", "File too large")
    assert output.read_text() == "an older vocabulary\n"
    assert sorted(os.listdir(tmp_path)) == ["big.txt", "vocab.txt"]


def test_bad_glob_exits_2_naming_train(tmp_path):
    out = tmp_path / "vocab.txt"
    proc = run_build_vocab("--train", tmp_path / "nothing" / "*.txt", "--output", out)
    assert proc.returncode == 2
    assert "--train" in proc.stderr and "no files match" in proc.stderr
    assert not out.exists()
