"""HDF5 files that point outside themselves, built with h5py, for the tests of `elmo_tf.io.hdf5_safety` and of every
loader that reads an hdf5 from outside (weights, softmax, token embeddings, NER caches, model dirs).

`make_reference(kind, path, name, shape)` replaces the dataset `name` of the file `path` by one of `KINDS`, each
holding (or leading to) `SECRET` values of exactly `shape`, stored in another file: a loader that follows it reads
those values as if they were the file's own.
"""

import h5py
import numpy as np
from h5py import h5f

SECRET = 777.0  # the other file's values: they must never appear in what a loader returns
KINDS = ("external_link", "external_group", "soft_link", "virtual", "external_storage", "plugin_filter")


def secret_file(directory, shape):
    """An hdf5 `secret.hdf5` in `directory` with dataset `secret` (and `group/secret`) of `shape` full of SECRET,
    and a raw `secret.bin` of the same float32 values. Returns `(hdf5 path, raw path)`."""
    path, raw = directory / "secret.hdf5", directory / "secret.bin"
    values = np.full(shape, SECRET, np.float32)
    with h5py.File(path, "w") as f:
        f["secret"] = values
        f.create_group("group")["secret"] = values
    raw.write_bytes(values.tobytes())
    return path, raw


def make_reference(kind, path, name, shape):
    """Replaces dataset `name` of the hdf5 at `path` (its parent groups kept) by `kind`; returns the link or dataset
    the loader must name: `name` itself, or its parent group for "external_group"."""
    secret, raw = secret_file(path.parent, shape)
    with h5py.File(path, "r+") as f:
        del f[name]
        parent, _, leaf = name.rpartition("/")
        if kind == "external_link":
            f[name] = h5py.ExternalLink(str(secret), "/secret")
        elif kind == "external_group":  # the whole group `parent` lies in the other file
            with h5py.File(secret, "r+") as g:
                g.create_group("outside")[leaf] = np.full(shape, SECRET, np.float32)
                for other in f[parent]:  # the group's other members too, so that nothing else is missing
                    g["outside"][other] = np.full(f[parent][other].shape, SECRET, np.float32)
            del f[parent]
            f[parent] = h5py.ExternalLink(str(secret), "/outside")
            return parent
        elif kind == "soft_link":  # a path in the same file, which may lead through an external link
            f["elsewhere/secret"] = h5py.ExternalLink(str(secret), "/secret")
            f[name] = h5py.SoftLink("/elsewhere/secret")
            return "elsewhere/secret"  # the walk meets the external link first (names in order) or the soft link
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=shape, dtype="f4")
            layout[...] = h5py.VirtualSource(str(secret), "secret", shape=shape)
            f.create_virtual_dataset(name, layout)
        elif kind == "external_storage":
            f.create_dataset(name, shape=shape, dtype="f4", external=[(str(raw), 0, h5f.UNLIMITED)])
        elif kind == "plugin_filter":  # 32015: zstd, a plugin HDF5 would look for in HDF5_PLUGIN_PATH
            f.create_dataset(
                name, data=np.zeros(shape, np.float32), chunks=shape, compression=32015, allow_unknown_filter=True
            )
        else:
            raise ValueError(f"unknown kind {kind!r}")
    return name


def message_names(message, kind, name):
    """Whether an error message names what `make_reference` made."""
    if kind == "soft_link":
        return "'elsewhere/secret'" in message or "soft link" in message
    return repr(name) in message
