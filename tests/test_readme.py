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
