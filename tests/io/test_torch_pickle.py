"""elmo_tf/io/torch_pickle.py: torch state dicts read without torch, and nothing in a file ever runs.

The `.pkl` files under tests/fixtures/efml/ were written by torch itself (bench/record_efml_fixtures.py):
`word/model` in the legacy format (torch.save(..., _use_new_zipfile_serialization=False), as torch 0.4 wrote the
released ELMoForManyLangs models), `noword/model` in the zip format.
"""

import os
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.torch_pickle import LEGACY_MAGIC, LEGACY_PROTOCOL, TorchPickleError, load_state_dict

EFML = Path(__file__).resolve().parents[1] / "fixtures" / "efml"


class _Exploit:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


def _legacy_bytes(main):
    """A legacy torch file whose main pickle is `main` (pickled by Python with protocol 2)."""
    parts = [pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": True})]
    return b"".join(parts) + pickle.dumps(main, protocol=2) + pickle.dumps([], protocol=2)


@pytest.mark.parametrize("fmt", ["legacy", "zip", "bare"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, fmt):
    marker = tmp_path / "pwned"
    payload = {"weight": _Exploit(marker)}
    path = tmp_path / "evil.pkl"
    if fmt == "legacy":
        path.write_bytes(_legacy_bytes(payload))
    elif fmt == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(TorchPickleError) as e:
        load_state_dict(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and "system" in message and "refused" in message
    assert isinstance(e.value, ElmoTFError) and e.value.path == str(path)
    assert not marker.exists()  # the command never ran


def test_a_builtin_callable_is_refused(tmp_path):
    path = tmp_path / "eval.pkl"
    path.write_bytes(_legacy_bytes({"x": _Eval()}))
    with pytest.raises(TorchPickleError, match=r"refused to load the global (__builtin__|builtins)\.eval"):
        load_state_dict(path)


def test_the_legacy_format_written_by_torch_reads():
    state = load_state_dict(EFML / "word" / "model" / "token_embedder.pkl")
    assert list(state)[0] == "word_emb_layer.embedding.weight"
    words = state["word_emb_layer.embedding.weight"]
    assert words.dtype == np.float32 and words.shape[1] == 5
    # EmbeddingLayer(normalize=True) made every row unit-length before the recorder's noise: not all-equal data
    assert np.unique(words).size > words.size // 2
    conv = state["convolutions.2.weight"]
    assert conv.shape == (8, 6, 3) and conv.flags.c_contiguous


def test_the_zip_format_written_by_torch_reads():
    state = load_state_dict(EFML / "noword" / "model" / "encoder.pkl")
    assert state["forward_layer_0.input_linearity.weight"].shape == (96, 16)
    assert state["backward_layer_1.state_linearity.bias"].shape == (96,)
    assert "word_emb_layer.embedding.weight" not in load_state_dict(EFML / "noword" / "model" / "token_embedder.pkl")


def test_both_formats_agree_on_the_same_tensors(tmp_path):
    """The legacy file rewritten as a zip archive (its main pickle as data.pkl, each storage as data/<key>) reads
    to the same arrays: the two readers agree."""
    legacy = EFML / "word" / "model" / "encoder.pkl"
    state = load_state_dict(legacy)
    with open(legacy, "rb") as f:
        for _ in range(3):  # magic number, protocol version, sys info: plain values
            pickle.load(f)
        start = f.tell()
        for _ in pickletools.genops(f):  # walks the main pickle's opcodes to its STOP without running anything
            pass
        end = f.tell()
        keys = pickle.load(f)  # a list of str
        raw = {}
        for key in keys:
            (numel,) = struct.unpack("<q", f.read(8))
            raw[key] = f.read(4 * numel)
    main = legacy.read_bytes()[start:end]
    path = tmp_path / "zipped.pkl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", main)
        for key, data in raw.items():
            z.writestr(f"archive/data/{key}", data)
    zipped = load_state_dict(path)
    assert list(zipped) == list(state) and len(state) == 16
    for key in state:
        np.testing.assert_array_equal(zipped[key], state[key])


def test_truncated_and_foreign_files_are_one_line_errors(tmp_path):
    legacy = (EFML / "word" / "model" / "encoder.pkl").read_bytes()
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(legacy[: len(legacy) - 100])
    with pytest.raises(TorchPickleError, match="truncated"):
        load_state_dict(cut)
    text = tmp_path / "notes.pkl"
    text.write_text("hello\n")
    with pytest.raises(TorchPickleError, match="not a torch file") as e:
        load_state_dict(text)
    assert "\n" not in str(e.value)
    with pytest.raises(TorchPickleError, match="cannot open"):
        load_state_dict(tmp_path / "missing.pkl")
    not_a_dict = tmp_path / "list.pkl"
    not_a_dict.write_bytes(_legacy_bytes([1, 2]))
    with pytest.raises(TorchPickleError, match="not a state dict"):
        load_state_dict(not_a_dict)
