"""`python -m elmo_tf embed` on lines of 100,000 and 1,000,000 tokens (issue 49): such a line is split into pieces of
`--max-sentence-tokens` (default `DEFAULT_MAX_SENTENCE_TOKENS`), so one model call never grows with a line: memory
stays near a short input's, and SIGTERM ends the command within seconds wherever it lands (it waited for TensorFlow's
current call: 30.7 s on a 100,000-token line, 387 s and 3.96 GB on a 1,000,000-token one), keeping the journal for
`--resume`, which then writes the uninterrupted run's file.

The commands run in real processes (forked from the worker's fork server: `forked`), on the tiny test model.
"""

import os
import signal
import subprocess
import sys
import time

import forked
import h5py
import numpy as np
import pytest
from cli_testlib import REPO_ROOT
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.io.journal import state_dir_of
from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS
from elmo_tf.models import ELMo, save_elmo

WAIT = 300  # seconds, a guard against hangs, not a speed contract
SIGTERM_SECONDS = 10  # the promise: SIGTERM ends the command within this, wherever it lands
WORDS = "the cat sat on a mat and ran far away from home quickly naïve café".split()


def line_of(n, seed):
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[k] for k in rng.integers(0, len(WORDS), size=n))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model; `short.txt` (3 lines); `huge.txt` (one line of 1,000,000 tokens, 5 MB); `mixed.txt` (600 short
    lines, a line of 100,000 tokens, 600 short lines)."""
    d = tmp_path_factory.mktemp("long_lines")
    save_elmo(ELMo(BiLMConfig(**TINY)), d / "model")
    (d / "short.txt").write_text("a b c\nthe cat sat\nx\n", encoding="utf-8")
    (d / "huge.txt").write_text(line_of(1_000_000, 1) + "\n", encoding="utf-8")
    short = [line_of(int(n), k) for k, n in enumerate(np.random.default_rng(2).integers(1, 40, size=1200))]
    (d / "mixed.txt").write_text("\n".join([*short[:600], line_of(100_000, 3), *short[600:]]) + "\n", encoding="utf-8")
    return d


def argv(files, input, output, *extra):
    model = files / "model"
    args = ["--options", model / "options.json", "--weights", model / "weights.hdf5", "--input", input]
    return [sys.executable, "-m", "elmo_tf", "embed", *map(str, (*args, "--output", output, *extra))]


def start(args, stderr_path):
    with open(stderr_path, "wb") as err:
        return forked.Popen(
            args,
            cwd=REPO_ROOT,
            preexec_fn=forked.default_sigint,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def peak_rss(process):
    """Waits for `process`; returns (its exit status, its peak RSS in bytes: /proc's VmHWM, read until it ends)."""
    peak, deadline = 0, time.monotonic() + WAIT
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{process.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.02)
    return process.wait(WAIT), peak


@pytest.mark.slow
def test_a_million_token_line_is_split_and_needs_no_more_memory_than_a_short_input(files, tmp_path):
    """1,000,000 tokens on one line: written whole (every token's vector, the pieces' in order), the file's
    attributes say how, and the peak RSS is within 300 MB of a 3-line input's (it was 3.96 GB)."""
    peaks = {}
    for name in ("short", "huge"):
        output = tmp_path / f"{name}.hdf5"
        # 512 rows a batch: 65 pieces a model call, 16 calls (the test's time); memory holds one call's arrays
        args = argv(files, files / f"{name}.txt", output, "--layers", "top", "--batch-size", "512")
        process = start(args, tmp_path / f"{name}.err")
        status, peaks[name] = peak_rss(process)
        stderr = (tmp_path / f"{name}.err").read_text(errors="replace")
        assert status == 0, stderr[-3000:]
    assert peaks["short"] > 0 and peaks["huge"] - peaks["short"] < 300 << 20, peaks
    assert f"1 split in pieces of {DEFAULT_MAX_SENTENCE_TOKENS} tokens" in stderr, stderr[-3000:]
    with h5py.File(tmp_path / "huge.hdf5", "r") as f:
        expected = {"max_sentence_tokens": DEFAULT_MAX_SENTENCE_TOKENS, "long_sentences": "split"}
        assert dict(f.attrs) == {**expected, "precision": "float32"}
        dataset = f["0"]
        assert dataset.shape == (1_000_000, 2 * TINY["projection_dim"])
        head, tail = dataset[:2000], dataset[-1000:]
    assert np.isfinite(head).all() and np.isfinite(tail).all() and np.abs(tail).max() > 0
    # a piece is a sentence of its own: its first token is computed as a line's first token is
    assert not np.array_equal(head[999], head[1000])


def read_all(path):
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}, dict(f.attrs)


EXTRA = ("--shard-tokens", "5000")  # about 12,000 tokens of short lines, then the long line in the third shard


@pytest.fixture(scope="module")
def reference(files):
    """The uninterrupted run on mixed.txt."""
    output = files / "reference.hdf5"
    done = forked.run(argv(files, files / "mixed.txt", output, *EXTRA), cwd=REPO_ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_all(output)


@pytest.mark.parametrize("shards", [1, 2], ids=["short-lines", "long-line"])
@pytest.mark.slow
def test_sigterm_ends_embed_within_seconds_keeps_the_journal_and_resume_finishes(files, reference, tmp_path, shards):
    """SIGTERM once the run has `shards` finished shards (1: among short lines; 2: at the 100,000-token line, in the
    third shard): exit 143 within `SIGTERM_SECONDS`, no traceback, the journal kept; `--resume` then writes the
    uninterrupted run's file, value for value."""
    output, stderr_path = tmp_path / "out.hdf5", tmp_path / "err.txt"
    process = start(argv(files, files / "mixed.txt", output, *EXTRA), stderr_path)
    try:
        state, deadline = state_dir_of(output), time.monotonic() + WAIT
        while not (os.path.isdir(state) and sum(n.startswith("shard-") for n in os.listdir(state)) >= shards):
            assert process.poll() is None and time.monotonic() < deadline, stderr_path.read_text()[-3000:]
            time.sleep(0.01)
        time.sleep(0.3)
        assert process.poll() is None, "the run ended before SIGTERM"
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        status = process.wait(WAIT)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
    stderr = stderr_path.read_text(errors="replace")
    assert status == 143 and "Traceback" not in stderr, stderr[-3000:]
    assert seconds < SIGTERM_SECONDS, (seconds, stderr[-3000:])
    print(f"SIGTERM to exit: {seconds:.2f} s")
    assert f"finished shards are kept in {state_dir_of(output)}" in stderr, stderr[-3000:]
    assert sum(n.startswith("shard-") for n in os.listdir(state_dir_of(output))) >= shards
    resumed = forked.run(
        argv(files, files / "mixed.txt", output, *EXTRA, "--resume"), cwd=REPO_ROOT, capture_output=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not os.path.exists(state_dir_of(output))
    got = read_all(output)
    assert got[1] == reference[1] and sorted(got[0]) == sorted(reference[0])
    for name, array in reference[0].items():
        np.testing.assert_array_equal(got[0][name], array, err_msg=name)
