"""elmo_tf/io/journal.py: a resumable run's state beside its output, and what an interruption can leave of it."""

import hashlib
import json
import os

import pytest

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.journal import JournalBusy, ResumeRefused, RunJournal, file_digest, state_dir_of

PRINT = {"input": {"sha256": "ab" * 32, "size": 10}, "layers": "all", "batch_size": 64}


class Stop(Exception):
    pass


def interrupted(output, fingerprint=PRINT, resume=False, shards=(), **kwargs):
    """Enters a journal, writes `shards` (a few bytes each), leaves with an exception: the state stays (when it holds
    a shard)."""
    with pytest.raises(Stop):
        with RunJournal(output, fingerprint, resume=resume, **kwargs) as journal:
            for number in shards:
                with open(journal.shard_path(number), "wb") as f:
                    f.write(b"shard %d" % number)
            raise Stop
    return journal


def test_file_digest_counts_lines_as_the_reader_does(tmp_path):
    for data, lines in [(b"", 0), (b"a\n", 1), (b"a\nb", 2), (b"a\r\n\n\nb\n", 4), (b"\n", 1)]:
        path = tmp_path / "f.txt"
        path.write_bytes(data)
        assert file_digest(path, chunk=2) == {
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "lines": lines,
        }


def test_a_finished_run_leaves_nothing_and_an_interrupted_one_its_shards(tmp_path):
    output = tmp_path / "out.hdf5"
    with RunJournal(output, PRINT) as journal:
        assert journal.path == state_dir_of(output) == str(tmp_path / ".out.hdf5.partial")
        assert sorted(os.listdir(journal.path)) == ["manifest.json"] and not journal.resumed
    assert os.listdir(tmp_path) == []
    journal = interrupted(output, shards=[0, 1])
    assert sorted(os.listdir(journal.path)) == ["manifest.json", "shard-000000.hdf5", "shard-000001.hdf5"]
    manifest = json.loads((tmp_path / ".out.hdf5.partial" / "manifest.json").read_text())
    assert manifest["fingerprint"] == PRINT and manifest["pid"] == os.getpid() and manifest["format"] == 1


def test_an_interrupted_run_with_no_finished_shard_leaves_no_journal(tmp_path):
    """Nothing a resume could keep: the journal goes (issue 38: embed killed by a full disk before its first shard left
    `.OUT.partial/manifest.json` without a word); a temporary of a shard being written goes with it."""
    output = tmp_path / "out.hdf5"
    with pytest.raises(Stop):
        with RunJournal(output, PRINT) as journal:
            with open(os.path.join(journal.path, ".shard-000000.hdf5.tmp-1-0123abcd"), "wb") as f:
                f.write(b"half a shard")
            raise Stop
    assert os.listdir(tmp_path) == []
    interrupted(output, shards=[0])  # one shard: kept, and a resume keeps it
    with RunJournal(output, PRINT, resume=True) as journal:
        assert journal.resumed and sorted(journal.done) == [0]


def test_resume_keeps_finished_shards_and_drops_temporaries(tmp_path):
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0, 1, 2])
    state = tmp_path / ".out.hdf5.partial"
    (state / ".shard-000003.hdf5.tmp-999999999-0123abcd").write_bytes(b"half a shard")
    (state / ".manifest.json.tmp-999999999-0123abcd").write_bytes(b"{half")
    with RunJournal(output, PRINT, resume=True) as journal:
        assert journal.resumed
        assert journal.done == {k: str(state / f"shard-{k:06d}.hdf5") for k in range(3)}
        assert sorted(os.listdir(state)) == ["manifest.json"] + [f"shard-{k:06d}.hdf5" for k in range(3)]
        journal.discard(1)
        assert sorted(journal.done) == [0, 2] and not (state / "shard-000001.hdf5").exists()
    assert not state.exists()


def test_without_resume_an_old_state_is_removed(tmp_path):
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0, 1])
    with RunJournal(output, {**PRINT, "layers": "top"}) as journal:
        assert not journal.resumed and journal.done == {}
        assert os.listdir(journal.path) == ["manifest.json"]


def test_resume_without_a_manifest_starts_over(tmp_path):
    """A run killed before its manifest was whole leaves shards nobody can vouch for (here: only a temporary)."""
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0])
    state = tmp_path / ".out.hdf5.partial"
    os.remove(state / "manifest.json")
    with RunJournal(output, PRINT, resume=True) as journal:
        assert not journal.resumed and journal.done == {} and os.listdir(state) == ["manifest.json"]


def test_a_different_run_is_refused_naming_each_difference_with_both_values(tmp_path):
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0], notes={"input": "a.txt"})
    changed = {"input": {"sha256": "cd" * 32, "size": 10}, "layers": "top", "batch_size": 64, "dtype": "float16"}
    shown = {"input": lambda v: f"sha256 {v['sha256'][:6]}"}
    with pytest.raises(ResumeRefused) as caught:
        with RunJournal(output, changed, resume=True, notes={"input": "b.txt"}, shown=shown):
            pass
    assert caught.value.differences == [
        ("input", "sha256 ababab (a.txt)", "sha256 cdcdcd (b.txt)"),
        ("layers", '"all"', '"top"'),
        ("dtype", "null", '"float16"'),
    ]
    assert caught.value.key == "resume" and str(tmp_path / ".out.hdf5.partial") in str(caught.value)
    with RunJournal(output, PRINT, resume=True) as journal:  # refused, not removed: the same run still resumes
        assert journal.resumed and sorted(journal.done) == [0]


def test_an_entry_added_since_the_journal_was_written_compares_as_its_default(tmp_path):
    """A partial run of an earlier version has no `precision` entry: it was float32, so a float32 run resumes it and a
    bfloat16 run is refused naming both values."""
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0])
    defaults = {"precision": "float32"}
    with pytest.raises(ResumeRefused) as caught:
        with RunJournal(output, {**PRINT, "precision": "bfloat16"}, resume=True, defaults=defaults):
            pass
    assert caught.value.differences == [("precision", '"float32"', '"bfloat16"')]
    with RunJournal(output, {**PRINT, "precision": "float32"}, resume=True, defaults=defaults) as journal:
        assert journal.resumed and sorted(journal.done) == [0]
    interrupted(output, shards=[0])
    with pytest.raises(ResumeRefused, match='precision: null .partial run. vs "float32" .this run.'):
        with RunJournal(output, {**PRINT, "precision": "float32"}, resume=True):  # without the default: refused
            pass


def test_a_journal_of_another_format_is_refused(tmp_path):
    output = tmp_path / "out.hdf5"
    interrupted(output, shards=[0])
    path = tmp_path / ".out.hdf5.partial" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 99}))
    with pytest.raises(ResumeRefused, match="journal format: 99 .partial run. vs 1"):
        with RunJournal(output, PRINT, resume=True):
            pass


def test_one_run_at_a_time(tmp_path):
    output = tmp_path / "out.hdf5"
    with RunJournal(output, PRINT):
        for resume in (False, True):
            with pytest.raises(JournalBusy, match=f"process {os.getpid()} is writing"):
                with RunJournal(output, PRINT, resume=resume):
                    pass
        assert os.listdir(state_dir_of(output)) == ["manifest.json"]  # the busy attempts removed nothing
    with RunJournal(output, PRINT):  # the lock went with the first run
        pass


@pytest.mark.parametrize("resume", [False, True])
def test_a_journal_path_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, resume):
    """`.out.hdf5.partial` planted as a link to a directory of someone's files (a shared /tmp, a careless `ln -s`):
    a run without --resume used to clear the directory it points to, every file of it."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    (precious / "shard-000000.hdf5").write_bytes(b"not ours either")
    output = tmp_path / "out.hdf5"
    os.symlink(precious, tmp_path / ".out.hdf5.partial")
    with pytest.raises(ElmoTFError, match=r"\.out\.hdf5\.partial is a symbolic link"):
        with RunJournal(output, PRINT, resume=resume):
            pass
    assert sorted(os.listdir(precious)) == ["shard-000000.hdf5", "thesis.tex"]
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_a_journal_dir_holding_files_no_run_wrote_is_refused_not_cleared(tmp_path):
    output = tmp_path / "out.hdf5"
    state = tmp_path / ".out.hdf5.partial"
    state.mkdir()
    (state / "notes.txt").write_text("mine")
    with pytest.raises(ElmoTFError, match=r"holds notes\.txt, which no elmo_tf run wrote"):
        with RunJournal(output, PRINT):
            pass
    assert (state / "notes.txt").read_text() == "mine"


def test_a_journal_removed_just_before_the_lock_is_made_again_not_locked_unlinked(tmp_path, monkeypatch):
    """Run A ends (clears and removes its journal) between run B's open and B's lock: B used to lock the unlinked
    directory and fail on it with a FileNotFoundError traceback (or, with a third run making a new one, two runs
    would each hold "the" lock of one output)."""
    import fcntl

    import elmo_tf.io.journal as journal_module

    output = tmp_path / "out.hdf5"
    state = tmp_path / ".out.hdf5.partial"
    state.mkdir()  # left by run A, which is ending
    calls = []

    class RacingFcntl:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, op):
            if not calls:
                os.rmdir(state)  # A's __exit__, just before B's lock
            calls.append(op)
            return fcntl.flock(fd, op)

    monkeypatch.setattr(journal_module, "fcntl", RacingFcntl)
    with RunJournal(output, PRINT) as journal:
        assert os.listdir(journal.path) == ["manifest.json"] and len(calls) == 2
        assert os.stat(journal.path).st_ino == os.fstat(journal._fd).st_ino
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("spec", ["shard", "shard:x:SIGKILL", "shard:1:SIGNOPE", "shard:1:getsignal"])
def test_a_malformed_fault_spec_is_ignored_not_a_traceback(monkeypatch, spec):
    from elmo_tf.io.journal import FAULT_ENV, fault_point

    monkeypatch.setenv(FAULT_ENV, spec)
    fault_point("shard")  # used to raise ValueError / AttributeError from the middle of a run


def test_a_journal_in_a_missing_directory_is_a_write_error_that_says_so(tmp_path):
    """Not "keeps being removed and made again by other runs" (issue 49): that is said only when it happened."""
    from elmo_tf.io.atomic import WriteError

    with pytest.raises(WriteError) as info:
        with RunJournal(tmp_path / "nope" / "out.hdf5", PRINT):
            pass
    message = str(info.value)
    assert "No such file or directory" in message and str(tmp_path / "nope") in message, message
    assert "removed and made again" not in message
    under_a_file = tmp_path / "file"
    under_a_file.write_text("x")
    with pytest.raises(WriteError, match="Not a directory"):
        with RunJournal(under_a_file / "out.hdf5", PRINT):
            pass
