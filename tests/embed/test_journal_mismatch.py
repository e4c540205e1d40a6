"""`embed --resume` and `score --resume` on a journal that does not match its shards (issue 49): a manifest edited by
hand (its fingerprint made to match a new --shard-tokens, so the shards on disk follow another plan), a shard replaced
by another, a shard of another shape, a shard added past the plan's end. Each is ONE line naming --resume and the
shard, exit 2, no traceback, and the journal is kept as it was (it was "index 192 is already written", a traceback).
A shard deleted is computed again: the run finishes with the uninterrupted run's file.
"""

import json
import os
import shutil

import h5py
import numpy as np
import pytest
from cli_testlib import assert_ends_with_one_error
from resume_testlib import run_elmo_tf, shards
from tiny_models import TINY, randomize_weights

from elmo_tf.config import BiLMConfig
from elmo_tf.io.journal import state_dir_of
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer, ELMo, save_elmo
from elmo_tf.pretraining import write_model_dir

WORDS = ["<S>", "</S>", "<UNK>"] + "the cat sat on a mat dog ran far away . ,".split()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("journal_mismatch")
    save_elmo(ELMo(BiLMConfig(**TINY)), d / "model")
    model = BiLMPretrainer(BiLMConfig(**TINY), len(WORDS), dropout=0.0)
    randomize_weights(model, 11, scale=0.5)
    write_model_dir(model, Vocabulary(WORDS), d / "run")
    rng = np.random.default_rng(4)
    lines = [" ".join(rng.choice(WORDS[3:], size=rng.integers(1, 12))) for _ in range(300)]
    (d / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def embed(files, output, *extra, fault=None):
    model = files / "model"
    args = ["--options", model / "options.json", "--weights", model / "weights.hdf5", "--input", files / "in.txt"]
    return run_elmo_tf("embed", [*args, "--output", output, "--batch-size", "8", *extra], fault=fault)


def score(files, output, *extra, fault=None):
    args = ["--model", files / "run", "--input", files / "in.txt", "--output", output, "--batch-size", "8"]
    return run_elmo_tf("score", [*args, *extra], fault=fault)


COMMANDS = {"embed": (embed, "shard-{:06d}.hdf5"), "score": (score, "shard-{:06d}.jsonl")}


def edit_manifest(state, name):
    path = os.path.join(state, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    manifest["fingerprint"]["shard_tokens"] = 2000
    with open(path, "w") as f:
        json.dump(manifest, f)


def damage(state, name, how):
    """Changes the journal `state` (shards named by `name`) as `how` says; returns the extra flags of the resume."""
    shard = os.path.join(state, name.format(1))
    if how == "edited-manifest":
        edit_manifest(state, name)
        return ("--shard-tokens", "2000")
    if how == "shard-replaced":
        shutil.copyfile(os.path.join(state, name.format(0)), shard)
    elif how == "shard-added":
        shutil.copyfile(os.path.join(state, name.format(0)), os.path.join(state, name.format(99)))
    elif how == "other-shape":
        if shard.endswith(".jsonl"):
            with open(shard, "rb") as f:
                lines = f.readlines()
            record = json.loads(lines[0])
            record["tokens"] = record["tokens"][:-1] + ["zebra"]
            lines[0] = (json.dumps(record) + "\n").encode()
            with open(shard, "wb") as f:
                f.writelines(lines)
        else:
            with h5py.File(shard, "r+") as f:
                name0 = next(n for n in f if n.isdigit())
                shape = f[name0].shape
                del f[name0]
                f.create_dataset(name0, data=np.zeros((shape[0], shape[1] + 1, shape[2]), np.float32))
    elif how == "shard-deleted":
        os.remove(shard)
    return ()


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("how", ["edited-manifest", "shard-replaced", "shard-added", "other-shape", "shard-deleted"])
@pytest.mark.slow
def test_a_journal_that_does_not_match_its_shards(files, tmp_path, command, how):
    run, name = COMMANDS[command]
    reference = tmp_path / "reference.out"
    assert run(files, reference, "--shard-tokens", "300").returncode == 0
    output = tmp_path / "out.out"
    killed = run(files, output, "--shard-tokens", "300", fault="shard:3:SIGKILL")
    assert killed.returncode == -9, killed.stderr[-3000:]
    state = state_dir_of(output)
    extra = damage(state, name, how)
    before = {entry: open(os.path.join(state, entry), "rb").read() for entry in sorted(os.listdir(state))}
    result = run(files, output, "--shard-tokens", "300", *extra, "--resume")
    if how == "shard-deleted":  # not a mismatch: the shard is computed again
        assert result.returncode == 0, result.stderr[-3000:]
        if command == "score":
            assert output.read_bytes() == reference.read_bytes()
        else:
            with h5py.File(output, "r") as got, h5py.File(reference, "r") as want:
                assert sorted(got) == sorted(want)
                for key in want:
                    np.testing.assert_array_equal(got[key][...], want[key][...])
        return
    assert_ends_with_one_error(result, 2, "--resume", "the journal does not match its shards", "it is kept")
    after = {entry: open(os.path.join(state, entry), "rb").read() for entry in sorted(os.listdir(state))}
    if how != "shard-added":  # an added shard is found past the plan's end, once the rest is computed
        assert after.keys() == before.keys()
    assert all(after[entry] == data for entry, data in before.items() if entry != "manifest.json")
    assert not output.exists() and shards(output)
