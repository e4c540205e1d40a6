"""elmo_tf/io/torch_pickle.py: torch state dicts read without torch, and nothing in a file ever runs.

The `.pkl` files under tests/fixtures/efml/ were written by torch itself (bench/record_efml_fixtures.py):
`word/model` in the legacy format (torch.save(..., _use_new_zipfile_serialization=False), as torch 0.4 wrote the
released ELMoForManyLangs models), `noword/model` in the zip format.
"""

import os
import pickle
import pickletools
import struct
import sys
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


class _StorageRef:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


def _lying_pickles(monkeypatch):
    """`(dumps, tensor)`: `dumps(obj)` pickles `obj` as torch does, where `tensor(storage, offset, size, stride)`
    stands for a tensor and `_StorageRef(key, numel)` for a storage (stand-in torch modules, only while pickling)."""
    import collections
    import io
    import types

    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called: only pickled")

    FloatStorage.__module__, FloatStorage.__qualname__, torch.FloatStorage = "torch", "FloatStorage", FloatStorage
    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)

    class _Tensor:
        def __init__(self, *args):
            self.args = args

        def __reduce__(self):
            return (_rebuild_tensor_v2, (*self.args, False, collections.OrderedDict()))

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _StorageRef):
                return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
            return None

    def dumps(obj):
        out = io.BytesIO()
        _Pickler(out, protocol=2).dump(obj)
        return out.getvalue()

    return dumps, _Tensor


def _legacy_file(path, dumps, main, storages):
    """Writes a legacy torch file: `main` pickled by `dumps`, then `storages` [(key, declared numel, raw bytes)]."""
    parts = [pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": True})]
    data = b"".join(parts) + dumps(main) + pickle.dumps([k for k, _, _ in storages], protocol=2)
    for _key, numel, raw in storages:
        data += struct.pack("<q", numel) + raw
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("numel", [10**15, 2**62])
def test_a_lying_storage_size_is_refused_before_anything_is_allocated(tmp_path, monkeypatch, numel):
    """A legacy file whose storage declares 4 PB (or more than an index holds) but carries 16 bytes: one error
    line, not a MemoryError/OverflowError from reading the declared size."""
    dumps, tensor = _lying_pickles(monkeypatch)
    path = _legacy_file(
        tmp_path / "liar.pkl", dumps, {"w": tensor(_StorageRef("0", numel), 0, (4,), (1,))}, [("0", numel, b"\0" * 16)]
    )
    with pytest.raises(TorchPickleError, match=r"truncated: storage 0 needs \d+ bytes, found 16"):
        load_state_dict(path)


def test_a_tensor_larger_than_its_storage_is_refused(tmp_path, monkeypatch):
    """size (100000, 100000) with stride 0 on a 1-element storage would allocate 37 GB when copied."""
    dumps, tensor = _lying_pickles(monkeypatch)
    main = {"w": tensor(_StorageRef("0", 1), 0, (100000, 100000), (0, 0))}
    path = _legacy_file(tmp_path / "broadcast.pkl", dumps, main, [("0", 1, b"\0" * 4)])
    with pytest.raises(TorchPickleError, match=r"does not fit its storage \(1 elements\)"):
        load_state_dict(path)


def test_a_self_referencing_pickle_is_one_line_not_a_recursion_error(tmp_path, monkeypatch):
    dumps, _ = _lying_pickles(monkeypatch)
    loop = []
    loop.append(loop)
    path = _legacy_file(tmp_path / "loop.pkl", dumps, {"w": loop}, [])
    with pytest.raises(TorchPickleError, match="entry 'w' is not a tensor"):
        load_state_dict(path)


def test_shared_storage_overlapping_and_strided_views_read_as_copies(tmp_path, monkeypatch):
    dumps, tensor = _lying_pickles(monkeypatch)
    storage = _StorageRef("0", 6)
    main = {"a": tensor(storage, 0, (2, 3), (3, 1)), "b": tensor(storage, 1, (3, 2), (1, 2))}
    path = _legacy_file(tmp_path / "views.pkl", dumps, main, [("0", 6, struct.pack("<6f", *range(6)))])
    state = load_state_dict(path)
    np.testing.assert_array_equal(state["a"], [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(state["b"], [[1, 3], [2, 4], [3, 5]])
    state["a"][0, 1] = 9  # each tensor is its own copy
    assert state["b"][0, 0] == 1


def test_a_compressed_or_missized_zip_storage_is_refused_before_decompressing(tmp_path, monkeypatch):
    """A zip bomb: 1 GiB of zeros deflated to 1 MB, declared by a consistent pickle. Refused from the member's
    header (torch writes storages uncompressed), so nothing is inflated."""
    dumps, tensor = _lying_pickles(monkeypatch)
    numel = 2**28
    path = tmp_path / "bomb.pkl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a/data.pkl", dumps({"w": tensor(_StorageRef("0", numel), 0, (numel,), (1,))}))
        with z.open("a/data/0", "w", force_zip64=True) as member:
            for _ in range(64):
                member.write(bytes(1 << 24))
    with pytest.raises(TorchPickleError, match="a/data/0 is compressed"):
        load_state_dict(path)
    with zipfile.ZipFile(path := tmp_path / "short.pkl", "w") as z:
        z.writestr("a/data.pkl", dumps({"w": tensor(_StorageRef("0", 4), 0, (4,), (1,))}))
        z.writestr("a/data/0", bytes(8))
    with pytest.raises(TorchPickleError, match="a/data/0 holds 8 bytes, expected 16"):
        load_state_dict(path)


def test_a_big_endian_file_is_refused_not_misread(tmp_path, monkeypatch):
    """Storages of a file saved on a big-endian machine would read as garbage numbers without an error."""
    dumps, tensor = _lying_pickles(monkeypatch)
    main = {"w": tensor(_StorageRef("0", 2), 0, (2,), (1,))}
    raw = struct.pack(">2f", 1.0, 2.0)
    zipped = tmp_path / "big.pkl"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("a/data.pkl", dumps(main))
        z.writestr("a/byteorder", "big")
        z.writestr("a/data/0", raw)
    with pytest.raises(TorchPickleError, match="a/byteorder is b'big'"):
        load_state_dict(zipped)
    parts = [pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": False})]
    legacy = tmp_path / "big_legacy.pkl"
    data = b"".join(parts) + dumps(main) + pickle.dumps(["0"], protocol=2) + struct.pack("<q", 2) + raw
    legacy.write_bytes(data)
    with pytest.raises(TorchPickleError, match="big-endian"):
        load_state_dict(legacy)


def test_an_unsupported_dtype_is_named_as_such(tmp_path):
    """A bfloat16 state dict is a dtype we do not read, not an attack: the message says so."""
    main = b"\x80\x02ctorch\nBFloat16Storage\nq\x00."
    path = tmp_path / "bf16.pkl"
    parts = [pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": True})]
    path.write_bytes(b"".join(parts) + main + pickle.dumps([], protocol=2))
    with pytest.raises(TorchPickleError, match=r"tensors of torch\.BFloat16Storage are not supported"):
        load_state_dict(path)
