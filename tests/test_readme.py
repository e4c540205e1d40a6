"""The README's Python quickstart runs as written (in a directory holding options.json + weights.hdf5), and the
model it builds trains and round-trips through `.keras`."""

import re
from pathlib import Path

import numpy as np
from tiny_models import TINY

REPO_ROOT = Path(__file__).resolve().parents[1]


def python_blocks(section):
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(f"## {section}")
    end = text.index("\n## ", start + 3)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_quickstart_runs_as_written(tmp_path, monkeypatch, capsys):
    import keras
    import tensorflow as tf

    from elmo_tf import BiLMConfig, ELMo, save_elmo

    save_elmo(ELMo(BiLMConfig(**TINY)), str(tmp_path))  # the options.json + weights.hdf5 the snippet loads
    monkeypatch.chdir(tmp_path)
    (code,) = python_blocks("Quickstart")
    assert len(code.strip().splitlines()) <= 15
    namespace = {}
    exec(compile(code, "README quickstart", "exec"), namespace)
    assert capsys.readouterr().out.strip() == "(2, 4, 9)"
    model = namespace["model"]
    frozen = [w.name for w in model.non_trainable_weights]
    assert frozen and all("scalar_mix" not in name for name in frozen)
    before = [w.numpy().copy() for w in model.non_trainable_weights]
    x = tf.constant([["The", "cat", "sat", "."], ["Hi", "", "", ""]])
    model.fit(x, np.zeros((2, 4)), epochs=1, verbose=0)
    for b, w in zip(before, model.non_trainable_weights):  # the biLM stays frozen
        np.testing.assert_array_equal(b, w.numpy())
    path = str(tmp_path / "quickstart.keras")
    model.save(path)
    again = keras.models.load_model(path)
    assert [w.name for w in again.trainable_weights] == [w.name for w in model.trainable_weights]  # still frozen
    np.testing.assert_allclose(again(x).numpy(), model(x).numpy(), atol=1e-6)


def test_getting_a_model_runs_as_written(tmp_path, monkeypatch, capsys):
    """The "Getting a model" snippet, with the registry's `original` replaced (ELMO_TF_REGISTRY) by a tiny model
    served from 127.0.0.1: downloaded on first use, then read from the cache."""
    from presets_testlib import served_models

    from elmo_tf import BiLMConfig, ELMo, save_elmo

    save_elmo(ELMo(BiLMConfig(**TINY)), str(tmp_path / "tiny"))
    original = {name: (tmp_path / "tiny" / name).read_bytes() for name in ("options.json", "weights.hdf5")}
    with served_models(tmp_path, monkeypatch, {"original": original}) as server:
        (code,) = python_blocks("Getting a model")
        namespace = {}
        exec(compile(code, "README getting a model", "exec"), namespace)
        assert len(server.requests) == 2  # the second line read the cache
    assert capsys.readouterr().out.strip() == str(TINY["projection_dim"])
    assert namespace["elmo"].mixes == ("ner",)


def test_getting_a_models_table_names_only_registered_models():
    from elmo_tf.presets.registry import presets

    table = (REPO_ROOT / "docs" / "getting-a-model.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z0-9.-]+)`", row.split("|")[1])}
    known = presets()
    assert named - {"efml-<code>"} <= set(known), named - set(known)
    assert sum(name.startswith("efml-") for name in known) == 44
    listed = named | {name for name in known if name.startswith("efml-")}
    assert set(known) <= listed, set(known) - listed  # every registered model has its row
