"""`elmo-tf models`, `elmo-tf download` and `--model NAME|DIR|URL` (elmo_tf/cli/models.py) as a user runs them: a
registry entry served from 127.0.0.1 (`ELMO_TF_REGISTRY`), listed, prefetched into `--cache-dir`, then used by
`embed --model` with the network gone, giving the same output as `embed --options --weights`; bad names, a 404 and
conflicting flags are one line each."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command
from presets_testlib import allennlp_model, served_models

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"


@pytest.fixture
def served(tmp_path, monkeypatch):
    with served_models(tmp_path, monkeypatch, {"fixture": allennlp_model()}) as server:
        yield server


def test_models_lists_download_prefetches_and_embed_uses_the_cache(served, tmp_path):
    cache = tmp_path / "home"  # $ELMO_TF_HOME: embed below finds what download put there
    listed = run_command(["-m", "elmo_tf", "models", "--cache-dir", cache])
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("fixture "))
    size = (FIXTURES / "options.json").stat().st_size + (FIXTURES / "lm_weights.hdf5").stat().st_size
    assert row.split()[1:5] == [f"{size / 1000:.1f}", "KB", "en", "absent"] and "test model fixture" in row
    assert "original " in listed.stdout and "efml-de " in listed.stdout  # the package's registry too

    fetched = run_command(["-m", "elmo_tf", "download", "fixture", "--cache-dir", cache, "--quiet"])
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout == f"fixture\t{cache / 'models' / 'fixture'}\n"
    as_json = json.loads(run_command(["-m", "elmo_tf", "models", "--cache-dir", cache, "--json"]).stdout)
    assert next(r for r in as_json if r["name"] == "fixture")["cache"] == "cached"

    served.files.clear()  # from here on the server answers 404: everything must come from the cache
    text = tmp_path / "in.txt"
    text.write_text("The cat sat .\nHello world\n")
    by_name = run_command(
        ["-m", "elmo_tf", "embed", "--model", "fixture", "--input", text, "--output", tmp_path / "a.hdf5", "--quiet"],
    )
    assert by_name.returncode == 0, by_name.stderr
    by_files = run_command(
        ["-m", "elmo_tf", "embed", "--options", FIXTURES / "options.json", "--weights", FIXTURES / "lm_weights.hdf5"]
        + ["--input", text, "--output", tmp_path / "b.hdf5", "--quiet"],
    )
    assert by_files.returncode == 0, by_files.stderr
    with h5py.File(tmp_path / "a.hdf5", "r") as a, h5py.File(tmp_path / "b.hdf5", "r") as b:
        assert sorted(a) == sorted(b)
        for key in ("0", "1"):
            np.testing.assert_array_equal(a[key][...], b[key][...])


def test_usage_errors_of_the_model_flags_are_one_line(served, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("a b\n")
    out = ["--input", text, "--output", tmp_path / "o.hdf5"]
    result = run_command(["-m", "elmo_tf", "embed", "--model", "nope", *out])
    assert_one_error(result, 2, "--model: preset 'nope': not a local directory, a URL or a released model name")
    result = run_command(["-m", "elmo_tf", "embed", "--model", "fixture", "--options", FIXTURES / "options.json", *out])
    assert_one_error(result, 2, "--model: not allowed with --options")
    result = run_command(["-m", "elmo_tf", "embed", *out])
    assert_one_error(result, 2, "--options and --weights: required (or --model NAME|DIR|URL)")
    score = ["score", "--model", "fixture", "--input", text, "--output", tmp_path / "s", "--quiet"]
    result = run_command(["-m", "elmo_tf", *score])
    assert_one_error(result, 2, "--model: 'fixture' publishes no softmax.hdf5; give --softmax")
    assert not (tmp_path / "o.hdf5").exists()


def test_a_failed_download_is_one_line_naming_the_url_and_keeps_nothing(served, tmp_path):
    served.files.pop("fixture/weights.hdf5")
    result = run_command(["-m", "elmo_tf", "download", "fixture", "--cache-dir", tmp_path / "c", "--quiet"])
    assert_one_error(result, 1, "model 'fixture': weights.hdf5", served.url("fixture/weights.hdf5"), "HTTP 404")
    assert not (tmp_path / "c" / "models" / "fixture" / "weights.hdf5").exists()
