"""Torch state dicts (`torch.save(module.state_dict(), path)`) read as NumPy arrays, without torch and without
running code from the file.

Both of torch's formats are read:
    legacy (torch < 1.6, ELMoForManyLangs' released `*.pkl`): a magic-number pickle, a protocol-version pickle, a
        sys-info pickle, the state dict's pickle (storages as persistent ids), a pickle of the storage keys, then
        each storage's raw bytes after an int64 element count (little-endian);
    zip (torch >= 1.6): `<name>/data.pkl` (the state dict's pickle) and `<name>/data/<key>` (raw storage bytes).

The unpickler resolves only the globals a state dict needs (`collections.OrderedDict`, torch's tensor rebuild
functions, the storage types) to inert stand-ins; any other global (`os.system`, `builtins.eval`, a module class)
is refused before anything runs, with one line naming the file and the global. A downloaded model file never
executes on load.
"""

import collections
import io
import math
import os
import pickle
import struct
import zipfile

import numpy as np

from elmo_tf.errors import ElmoTFError, one_line

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_PICKLE_BYTES = 64 << 20  # data.pkl of a zip file (names and tensor metadata only)

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class TorchPickleError(ElmoTFError):
    """A torch file that cannot be read as a state dict, or that asks for anything a state dict does not need.
    The message is one line naming the file."""


class _StorageType:
    def __init__(self, name):
        self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name]).newbyteorder("<")


class _Storage:
    """A storage named by a persistent id; `data` (1-D array) is filled once its bytes are read."""

    def __init__(self, key, dtype, numel):
        self.key, self.dtype, self.numel, self.data = key, dtype, numel, None


class _Tensor:
    """A tensor waiting for its storage's bytes (the legacy format stores them after the pickle)."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def resolve(self, path):
        data, size, stride = self.storage.data, self.size, self.stride
        ok = (
            all(isinstance(v, int) and v >= 0 for v in (self.offset, *size, *stride))
            and len(size) == len(stride)
            and data is not None
        )
        if ok and 0 not in size:
            ok = self.offset + sum((n - 1) * s for n, s in zip(size, stride)) < data.size
            # a state dict's tensor never holds more elements than its storage: a lying size with stride 0 (or
            # overlapping strides) would otherwise allocate without bound from a few bytes of file
            ok = ok and math.prod(size) <= data.size
        if not ok:
            raise TorchPickleError(
                f"{path}: a tensor of size {size}, stride {stride}, offset {self.offset} does not fit its storage "
                f"({'missing' if data is None else f'{data.size} elements'})"
            )
        if 0 in size:
            return np.zeros(size, data.dtype.newbyteorder("="))
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :], shape=size, strides=[s * data.itemsize for s in stride], writeable=False
        )
        return np.array(view, dtype=data.dtype.newbyteorder("="))


def _rebuild_tensor(storage, offset, size, stride, *rest):
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor's first argument must be a storage")
    if not (isinstance(size, tuple) and isinstance(stride, tuple)):
        raise pickle.UnpicklingError("a tensor's size and stride must be tuples")
    return _Tensor(storage, offset, size, stride)


def _rebuild_parameter(data, *rest):
    return data


_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, path, load_storage):
        super().__init__(file)
        self.path, self.load_storage, self.storages = path, load_storage, {}

    def find_class(self, module, name):
        if (module, name) in _GLOBALS:
            return _GLOBALS[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "torch" and name.endswith("Storage") and name.isidentifier():
            raise TorchPickleError(
                f"{self.path}: tensors of torch.{name} are not supported (only {', '.join(_STORAGE_DTYPES)}); "
                "convert them to float32 in torch first"
            )
        raise TorchPickleError(
            f"{self.path}: refused to load the global {module}.{name}: a torch state dict holds only tensors "
            "(OrderedDict, torch._utils._rebuild_tensor_v2, storage types); nothing from this file was run"
        )

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage")):
            raise TorchPickleError(f"{self.path}: refused the persistent id {one_line(repr(pid))[:80]}: not a storage")
        storage_type, key, numel = pid[1], str(pid[2]), pid[4]
        if not isinstance(storage_type, _StorageType) or not isinstance(numel, int) or numel < 0:
            raise TorchPickleError(f"{self.path}: a storage id {one_line(repr(pid))[:80]} is malformed")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(key, storage_type.dtype, numel)
            self.load_storage(storage)
        view = pid[5] if len(pid) > 5 else None
        if view is not None:  # (view key, offset, size) of a legacy storage view
            _, start, size = view
            if not (isinstance(start, int) and isinstance(size, int) and 0 <= start and 0 <= size):
                raise TorchPickleError(f"{self.path}: a storage view {one_line(repr(view))[:80]} is malformed")
            if start + size > storage.numel:
                raise TorchPickleError(f"{self.path}: a storage view {view!r} overruns its {storage.numel} elements")
            return _View(storage, start, size)
        return storage


class _View(_Storage):
    def __init__(self, base, start, size):
        super().__init__(base.key, base.dtype, size)
        self.base, self.start = base, start

    @property
    def data(self):
        return None if self.base.data is None else self.base.data[self.start : self.start + self.numel]

    @data.setter
    def data(self, value):
        pass


def _resolve(obj, path):
    """The state dict `obj` with each tensor read from its storage. A state dict is flat (name -> tensor): nothing
    is walked recursively, so a self-referencing or deeply nested pickle cannot exhaust the stack."""
    if not isinstance(obj, dict):
        raise TorchPickleError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    out = collections.OrderedDict()
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, _Tensor):
            raise TorchPickleError(f"{path}: entry {one_line(repr(key))[:80]} is not a tensor")
        out[key] = value.resolve(path)
    return out


def _read_exact(f, n, path, what):
    data = f.read(n)
    if len(data) != n:
        raise TorchPickleError(f"{path}: truncated: {what} needs {n} bytes, found {len(data)}")
    return data


def _load_legacy(f, path):
    def plain(what):
        try:
            return _Unpickler(f, path, lambda storage: None).load()
        except TorchPickleError:
            raise
        except Exception as e:
            raise TorchPickleError(f"{path}: not a torch file (reading its {what}): {one_line(e)}") from None

    if plain("magic number") != LEGACY_MAGIC:
        raise TorchPickleError(f"{path}: not a torch file: no torch magic number")
    if plain("protocol version") != LEGACY_PROTOCOL:
        raise TorchPickleError(f"{path}: unsupported torch protocol version (expected {LEGACY_PROTOCOL})")
    sys_info = plain("sys info")
    if isinstance(sys_info, dict) and sys_info.get("little_endian", True) is not True:
        raise TorchPickleError(
            f"{path}: written on a big-endian machine (its sys info says so); only little-endian reads"
        )
    unpickler = _Unpickler(f, path, lambda storage: None)
    result = _call(unpickler.load, path)
    keys = plain("storage keys")
    if not isinstance(keys, list):
        raise TorchPickleError(f"{path}: the storage keys are not a list")
    for key in keys:
        storage = unpickler.storages.get(str(key))
        if storage is None:
            raise TorchPickleError(f"{path}: storage {key!r} is listed but no tensor uses it")
        (numel,) = struct.unpack("<q", _read_exact(f, 8, path, f"storage {key}'s size"))
        if numel != storage.numel:
            raise TorchPickleError(f"{path}: storage {key!r} holds {numel} elements, its id says {storage.numel}")
        left = os.fstat(f.fileno()).st_size - f.tell()
        if numel * storage.dtype.itemsize > left:  # checked before reading: a lying size allocates nothing
            raise TorchPickleError(
                f"{path}: truncated: storage {key} needs {numel * storage.dtype.itemsize} bytes, found {left}"
            )
        raw = _read_exact(f, numel * storage.dtype.itemsize, path, f"storage {key}")
        storage.data = np.frombuffer(raw, storage.dtype)
    return _resolve(result, path)


def _load_zip(f, path):
    try:
        archive = zipfile.ZipFile(f)
        names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise TorchPickleError(f"{path}: not a readable torch zip file: {one_line(e)}") from None
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise TorchPickleError(f"{path}: a torch zip file holds one <name>/data.pkl, found {len(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    if f"{prefix}byteorder" in names:  # torch >= 2.1 records it; older zip files are little-endian
        order = _call(lambda: archive.read(f"{prefix}byteorder")[:16], path)
        if order != b"little":
            raise TorchPickleError(f"{path}: {prefix}byteorder is {order!r}; only little-endian storages read")

    def load_storage(storage):
        name = f"{prefix}data/{storage.key}"
        try:
            info = archive.getinfo(name)
        except KeyError:
            raise TorchPickleError(f"{path}: has no {name} for storage {storage.key!r}") from None
        # checked before decompressing: a member's declared size must match the pickle, and torch stores storages
        # uncompressed, so memory stays bounded by the file's own size (no zip bomb)
        if info.file_size != storage.numel * storage.dtype.itemsize:
            raise TorchPickleError(
                f"{path}: {name} holds {info.file_size} bytes, expected {storage.numel * storage.dtype.itemsize}"
            )
        if info.compress_type != zipfile.ZIP_STORED:
            raise TorchPickleError(f"{path}: {name} is compressed; torch writes storages uncompressed")
        raw = _call(lambda: archive.read(name), path)
        storage.data = np.frombuffer(raw, storage.dtype)

    info = archive.getinfo(pickles[0])
    if info.file_size > MAX_PICKLE_BYTES:  # a state dict's pickle is kilobytes; its tensors live in data/
        raise TorchPickleError(f"{path}: {pickles[0]} declares {info.file_size} bytes (at most {MAX_PICKLE_BYTES})")
    unpickler = _Unpickler(io.BytesIO(_call(lambda: archive.read(pickles[0]), path)), path, load_storage)
    return _resolve(_call(unpickler.load, path), path)


def _call(load, path):
    try:
        return load()
    except TorchPickleError:
        raise
    except Exception as e:  # a damaged pickle: any of pickle's many errors
        raise TorchPickleError(f"{path}: not a readable torch pickle: {type(e).__name__}: {one_line(e)}") from None


def load_state_dict(path):
    """The state dict saved at `path` by `torch.save`: an `OrderedDict` of name -> NumPy array (native byte order).

    Raises:
        TorchPickleError: a missing or unreadable file, a file that is neither torch format, a truncated storage,
            or any global a state dict does not need (nothing in the file is run).
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TorchPickleError(f"{path}: cannot open: {e.strerror}", path=str(path)) from None
    with f:
        head = f.read(4)
        f.seek(0)
        try:
            state = _load_zip(f, path) if head == b"PK\x03\x04" else _load_legacy(f, path)
        except TorchPickleError as e:
            e.path = str(path)
            raise
    if not isinstance(state, dict):
        raise TorchPickleError(f"{path}: holds a {type(state).__name__}, not a state dict", path=str(path))
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, np.ndarray):
            raise TorchPickleError(f"{path}: entry {key!r} is not a tensor", path=str(path))
    return state
