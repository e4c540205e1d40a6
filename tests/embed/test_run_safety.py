"""`python -m elmo_tf embed` as a careless user and a hostile signal meet it.

- an output that IS the input under another name (hard link, a symlinked directory): exit 2, one line, input kept
  (the same path, a symlink to the file and a relative spelling are in tests/cli/test_embed_errors.py);
- SIGTERM, SIGINT (Ctrl-C) and SIGKILL while the work is being written (a shard of the journal
  `.<output>.partial/`, see tests/embed/test_run_resume.py), to a real subprocess: the shard's temporary is removed
  (143, 130) or left for the next run to remove (SIGKILL), the finished shards are kept for `--resume`, an older
  output at the same path stays byte for byte, a live process's temporary is kept;
- a disk that refuses the output (a file-size limit: EFBIG, as a full disk gives ENOSPC), for embed and
  dump-token-embeddings: exit 1 with one error line naming the output and "File too large", no "Exception ignored"
  storm from h5py, no crash, no temporary, the older output byte for byte;
- what the output says about odd input lines (a UTF-8 byte order mark, invalid UTF-8): the lines are read through
  elmo_tf.io.sentences (a BOM is not part of the first token, lines differing in invalid bytes keep their keys).

Every wait is bounded (60 s); a run is signalled once its temporary holds some datasets, not before.
"""

import codecs
import json
import os
import random
import signal
import subprocess
import sys
import time

import forked
import h5py
import numpy as np
import pytest
from cli_testlib import REPO_ROOT, assert_ends_with_one_error, assert_one_error, own_lines, run_command, run_limited
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.io.sentences import sentence_key
from elmo_tf.models import ELMo, save_elmo

L, P = TINY["num_layers"], TINY["projection_dim"]
WAIT = 300  # seconds, the bound on every wait for a subprocess: a guard against hangs (full runs of the long input
# take 10-30 s here, 2.5x that on the slowest machines we build on), not a speed contract
MID_WRITE_BYTES = 64 * 1024  # a temporary this large holds a few dozen datasets: the run is writing
PREVIOUS = b"an older output that must survive\n" * 64
SHORT = ["The cat sat on the mat .", "", "Hi there", "one two three four five"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny biLM, a long input (a few thousand lines: a run lasts seconds) and a short one."""
    d = tmp_path_factory.mktemp("embed_safety")
    save_elmo(ELMo(BiLMConfig(**TINY)), d / "model")
    rng = random.Random(7)
    words = "the cat sat on a mat and ran far away from home quickly naïve café 日本語".split()
    with open(d / "long.txt", "w", encoding="utf-8") as f:
        for _ in range(6000):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) + "\n")
    (d / "short.txt").write_text("\n".join(SHORT) + "\n", encoding="utf-8")
    return d


def embed_args(files, input, output, *extra):
    model = files / "model"
    args = ["--options", model / "options.json", "--weights", model / "weights.hdf5", "--input", input]
    return [str(a) for a in (*args, "--output", output, *extra)]


def start_embed(files, input, output, stderr_path):
    """`python -m elmo_tf embed` started in a process of its own (its pid is the temporary's); stderr to a file,
    so that a full pipe never blocks it."""
    with open(stderr_path, "wb") as err:
        return forked.Popen(
            [sys.executable, "-m", "elmo_tf", "embed", *embed_args(files, input, output, "--batch-size", "8")],
            cwd=REPO_ROOT,
            preexec_fn=forked.default_sigint,  # a runner started with SIGINT ignored passes that on
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def temporaries(directory, name, pid=None):
    prefix = f".{name}.tmp-{'' if pid is None else f'{pid}-'}"
    return sorted(p for p in directory.iterdir() if p.name.startswith(prefix))


def all_temporaries(directory):
    """Every temporary under `directory`: the output's, and the journal's (its shards', its manifest's)."""
    return sorted(p for p in directory.rglob("*") if ".tmp-" in p.name)


def state_dir(output):
    return output.parent / f".{output.name}.partial"


def writing(output, pid):
    """The temporaries `pid` is writing: the output's, and the shards' in the journal."""
    found = temporaries(output.parent, output.name, pid)
    if state_dir(output).is_dir():
        found += [p for p in state_dir(output).iterdir() if f".tmp-{pid}-" in p.name]
    return found


def wait_until_writing(process, output, stderr_path):
    """The temporary of `process` once it holds `MID_WRITE_BYTES`; fails (and kills the process) if the run ends
    first or nothing comes within `WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"embed ended ({process.returncode}) before it could be signalled:\n{stderr_path.read_text()}")
        for tmp in writing(output, process.pid):
            try:
                if tmp.stat().st_size >= MID_WRITE_BYTES:
                    return tmp
            except FileNotFoundError:
                pass
        time.sleep(0.02)
    process.kill()
    process.wait(WAIT)
    pytest.fail(f"no temporary of {MID_WRITE_BYTES} bytes after {WAIT} s:\n{stderr_path.read_text()}")


def signal_mid_write(files, tmp_path, signum):
    """Runs embed on the long input into `tmp_path/out.hdf5` (holding `PREVIOUS`), sends `signum` while the
    temporary is being written; returns (exit status, stderr, output path, the temporary's path)."""
    output, stderr_path = tmp_path / "out.hdf5", tmp_path / "stderr.txt"
    output.write_bytes(PREVIOUS)
    process = start_embed(files, files / "long.txt", output, stderr_path)
    try:
        tmp = wait_until_writing(process, output, stderr_path)
        process.send_signal(signum)
        status = process.wait(WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
    return status, stderr_path.read_text(errors="replace"), output, tmp


def read_output(path):
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        arrays = {key: f[key][...] for key in f if key != "sentence_to_index"}
    return arrays, index


# ---------------------------------------------------------------- --output naming the input


def test_output_hard_linked_to_the_input(files, tmp_path):
    source = tmp_path / "sentences.txt"
    source.write_bytes(b"The cat sat .\n\nHi there\n")
    hard = tmp_path / "out.hdf5"
    os.link(source, hard)
    result = run_command(["-m", "elmo_tf", "embed", *embed_args(files, source, hard)], timeout=WAIT)
    assert_one_error(result, 2, "--output", "same file as --input", hard)
    assert source.read_bytes() == hard.read_bytes() == b"The cat sat .\n\nHi there\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.hdf5", "sentences.txt"]  # no temporary either


def test_output_through_a_symlinked_directory(files, tmp_path):
    (tmp_path / "data").mkdir()
    source = tmp_path / "data" / "sentences.txt"
    source.write_bytes(b"The cat sat .\n")
    (tmp_path / "alias").symlink_to(tmp_path / "data", target_is_directory=True)
    output = tmp_path / "alias" / "sentences.txt"
    result = run_command(["-m", "elmo_tf", "embed", *embed_args(files, source, output)], timeout=WAIT)
    assert_one_error(result, 2, "--output", "same file as --input", output)
    assert source.read_bytes() == b"The cat sat .\n"
    assert os.listdir(tmp_path / "data") == ["sentences.txt"]


# ---------------------------------------------------------------- signals while writing


def test_sigterm_mid_write_removes_the_temporary_and_keeps_the_old_output(files, tmp_path):
    status, stderr, output, tmp = signal_mid_write(files, tmp_path, signal.SIGTERM)
    assert status == 143, stderr
    assert "Traceback" not in stderr, stderr
    assert not tmp.exists() and all_temporaries(tmp_path) == []
    assert output.read_bytes() == PREVIOUS
    # stopped while its first shard was written: nothing a resume could keep, so no journal is left (issue 38)
    assert not state_dir(output).exists() and "--resume" not in stderr, stderr


def test_ctrl_c_mid_write_removes_the_temporary_and_keeps_the_old_output(files, tmp_path):
    status, stderr, output, tmp = signal_mid_write(files, tmp_path, signal.SIGINT)
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert own_lines(stderr)[-1] == "python -m elmo_tf embed: interrupted", stderr
    assert not tmp.exists() and all_temporaries(tmp_path) == []
    assert output.read_bytes() == PREVIOUS
    assert not state_dir(output).exists() and "--resume" not in stderr, stderr


def test_sigkill_leaves_a_temporary_that_the_next_run_removes(files, tmp_path):
    status, stderr, output, tmp = signal_mid_write(files, tmp_path, signal.SIGKILL)
    assert status == -signal.SIGKILL, stderr
    assert all_temporaries(tmp_path) == [tmp]  # expected: nothing runs after SIGKILL
    assert output.read_bytes() == PREVIOUS
    sleeper = subprocess.Popen(["sleep", str(3 * WAIT)])
    try:
        live = tmp_path / f".{output.name}.tmp-{sleeper.pid}-0123abcd"
        live.write_bytes(b"a run that is still going")
        result = run_command(["-m", "elmo_tf", "embed", *embed_args(files, files / "short.txt", output)], timeout=WAIT)
        assert result.returncode == 0, result.stderr
        assert all_temporaries(tmp_path) == [live]  # the dead run's is gone (with its journal), the live one's kept
        assert not state_dir(output).exists()
        assert live.read_bytes() == b"a run that is still going"
    finally:
        sleeper.kill()
        sleeper.wait(WAIT)
    arrays, index = read_output(output)
    assert index == {line: str(i) for i, line in enumerate(SHORT)}
    assert sorted(arrays, key=int) == [str(i) for i in range(len(SHORT))]
    for i, line in enumerate(SHORT):
        assert arrays[str(i)].shape == (L + 1, len(line.split()), 2 * P) and arrays[str(i)].dtype == np.float32
        assert np.isfinite(arrays[str(i)]).all()
    assert np.abs(arrays["0"]).max() > 0


# ---------------------------------------------------------------- a full disk


FILE_LIMIT = 200 * 1024  # the long input's output is ~2 MB; the model's files are read, not written


def test_a_full_disk_ends_embed_with_one_line_and_keeps_the_old_output(files, tmp_path):
    output = tmp_path / "out.hdf5"
    output.write_bytes(PREVIOUS)
    args = ["-m", "elmo_tf", "embed", *embed_args(files, files / "long.txt", output, "--batch-size", "8")]
    result = run_limited(args, FILE_LIMIT, timeout=WAIT)
    shard = state_dir(output) / "shard-000000.hdf5"  # the work goes to the journal first (test_run_resume.py)
    line = assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(shard)!r}", "File too large")
    assert output.read_bytes() == PREVIOUS
    # no shard finished: nothing to resume, so neither a hidden journal nor a word of --resume (issue 38)
    assert all_temporaries(tmp_path) == [] and not state_dir(output).exists()
    assert "--resume" not in line, line
    result = run_limited(["-m", "elmo_tf", "embed", *embed_args(files, files / "short.txt", output)], FILE_LIMIT)
    assert result.returncode == 0, result.stderr  # a small output fits under the same limit
    assert sorted(read_output(output)[0], key=int) == [str(i) for i in range(len(SHORT))]


def test_a_full_disk_ends_dump_token_embeddings_with_one_line(files, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(f"w{k}" for k in range(8000)) + "\n")  # 8000 x 8 floats: 256 kB
    output = tmp_path / "tokens.hdf5"
    output.write_bytes(PREVIOUS)
    model = files / "model"
    args = ["--options", model / "options.json", "--weights", model / "weights.hdf5", "--vocab", vocab]
    result = run_limited(
        ["-m", "elmo_tf", "dump-token-embeddings", *args, "--output", output], FILE_LIMIT, timeout=WAIT
    )
    assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(output)!r}", "File too large")
    assert output.read_bytes() == PREVIOUS
    assert sorted(os.listdir(tmp_path)) == ["tokens.hdf5", "vocab.txt"]


# ---------------------------------------------------------------- odd lines: a byte order mark, invalid UTF-8

ODD_LINES = [b"Hi there", b"caf\xe9 au lait", b"Hi there", b"caf\xe8 au lait"]  # written after a UTF-8 BOM


@pytest.fixture(scope="module")
def odd_output(files):
    """The output of one embed run on `ODD_LINES`."""
    source = files / "odd.txt"
    source.write_bytes(codecs.BOM_UTF8 + b"".join(line + b"\n" for line in ODD_LINES))
    output = files / "odd.hdf5"
    result = run_command(["-m", "elmo_tf", "embed", *embed_args(files, source, output)], timeout=WAIT)
    if result.returncode != 0:
        raise RuntimeError(f"embed failed ({result.returncode}):\n{result.stderr}")
    return read_output(output)


def test_a_byte_order_mark_is_not_part_of_the_first_token(odd_output):
    arrays, index = odd_output
    assert arrays["0"].shape == arrays["2"].shape == (L + 1, 2, 2 * P)
    # line 0 is line 2 ("Hi there") behind the BOM: the same tokens, the same vectors
    np.testing.assert_allclose(arrays["0"], arrays["2"], atol=1e-5, rtol=0)
    assert not any("\ufeff" in key for key in index), sorted(index)


def test_lines_differing_only_in_invalid_bytes_keep_their_own_keys(odd_output):
    arrays, index = odd_output
    first, second = sentence_key(ODD_LINES[1]), sentence_key(ODD_LINES[3])
    assert first != second
    assert index.get(first) == "1" and index.get(second) == "3", sorted(index.items())
    assert not np.allclose(arrays["1"], arrays["3"])  # different tokens, different vectors


@pytest.mark.slow
def test_a_full_disk_after_finished_shards_names_them_and_the_resume(files, tmp_path):
    """Shards fit under the limit, the merged output does not: the one error line names the journal directory, how
    many shards it keeps and the --resume command; the same command with --resume and room again finishes from them."""
    output = tmp_path / "out.hdf5"
    args = ["-m", "elmo_tf", "embed", *embed_args(files, files / "long.txt", output, "--shard-tokens", "2000")]
    result = run_limited(args, 1 << 20, timeout=WAIT)  # a shard is under 1 MiB, the output far over
    state = state_dir(output)
    kept = sorted(p.name for p in state.iterdir() if p.name.startswith("shard-"))
    assert len(kept) >= 2, kept
    line = assert_ends_with_one_error(result, 1, "--output", "File too large")
    assert f"the finished shards are kept in {state}: the same command with --resume" in line, line
    assert line.endswith(f"({len(kept)} kept)"), line
    assert not output.exists() and all_temporaries(tmp_path) == []
    resumed = run_command([*args, "--resume"], timeout=WAIT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(kept)} of " in resumed.stderr and not state.exists()
