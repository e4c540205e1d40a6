"""HDF5 files from outside (a weight file fetched by URL, a cache, a shard given back to us) read only when they hold
their data themselves.

h5py follows, silently and on first access, every way HDF5 has to point outside a file: an external link (a name whose
object lies in another file), a virtual dataset (its data mapped from datasets of other files), a dataset with
external raw storage (its bytes read from other files, any file the process can read), and a filter pipeline naming
a filter HDF5 does not have built in (it then loads a plugin library from `HDF5_PLUGIN_PATH`). A soft link is a path
inside the file, but it may lead through an external link, and no released bilm-tf / AllenNLP file has one: refused
too. What is read is what stock HDF5 reads without help: hard links to contiguous, compact or chunked datasets
stored in the file, with the built-in filters (deflate, shuffle, fletcher32, szip, nbit, scaleoffset) and h5py's
own lzf.

`check_self_contained(f, path)` walks every link of an open file without following any (HDF5's H5Lvisit recurses
through hard-linked groups only) and opens each dataset's header, never its data: it costs the metadata only.

Example:
    with h5py.File(path, "r") as f:
        check_self_contained(f, path)   # HDF5ReferenceError before any dataset is read
        data = f["embedding"][...]
"""

import os

import h5py
from h5py import h5d, h5l, h5o

from elmo_tf.errors import ElmoTFError, one_line

__all__ = ["BUILTIN_FILTERS", "HDF5ReferenceError", "check_self_contained", "open_self_contained"]

# filter ids HDF5 applies without loading a plugin (H5Zpublic.h), and lzf, which h5py registers itself
BUILTIN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset", 32000: "lzf"}

# what h5py raises for a file it cannot open (missing, truncated, not HDF5)
_OPEN_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


class HDF5ReferenceError(ElmoTFError):
    """An HDF5 file that points outside itself (an external or soft link, a virtual dataset, external storage) or
    names a filter HDF5 would load as a plugin. The message is one line naming the file, the dataset and what it
    points to; `key` is the dataset (or link), `path` the file."""


def _text(name):
    return name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else str(name)


def _link_problem(group_id, name, info):
    """What the non-hard link `name` points to, for a message."""
    try:
        value = group_id.links.get_val(name)
    except (OSError, RuntimeError, KeyError, ValueError):
        value = None
    if info.type == h5l.TYPE_EXTERNAL:
        target = f" to {_text(value[1])!r} in the file {_text(value[0])!r}" if value else ""
        return f"{_text(name)!r} is an external link{target}"
    if info.type == h5l.TYPE_SOFT:
        target = f" to {_text(value)!r}" if value is not None else ""
        return f"{_text(name)!r} is a soft link{target}"
    return f"{_text(name)!r} is a user-defined link (type {info.type})"


def _dataset_problem(dataset_id, name):
    """What makes the dataset `name` read outside the file or load a plugin, or None."""
    plist = dataset_id.get_create_plist()
    shown = f"dataset {_text(name)!r}"
    if plist.get_layout() == h5d.VIRTUAL:
        sources = [
            f"{_text(plist.get_virtual_dsetname(i))!r} in {_text(plist.get_virtual_filename(i))!r}"
            for i in range(min(plist.get_virtual_count(), 3))
        ]
        more = ", ..." if plist.get_virtual_count() > 3 else ""
        return f"{shown} is a virtual dataset mapped from {', '.join(sources)}{more}"
    count = plist.get_external_count()
    if count:
        files = [repr(_text(plist.get_external(i)[0])) for i in range(min(count, 3))]
        return (
            f"{shown} keeps its data in external storage: the file(s) {', '.join(files)}{', ...' if count > 3 else ''}"
        )
    for i in range(plist.get_nfilters()):
        code, _, _, filter_name = plist.get_filter(i)
        if code not in BUILTIN_FILTERS:
            return f"{shown} needs the filter {code} ({_text(filter_name) or 'unnamed'}), not built into HDF5: a plugin"
    return None


def check_self_contained(f, path, error_class=HDF5ReferenceError):
    """Raises `error_class` (one line naming `path`, the dataset or link and what it points to) unless every link
    of the open h5py file `f` is a hard link and every dataset holds its data in the file with built-in filters.

    Reads metadata only (the links, each dataset's creation properties), before any data; follows no link.
    A structure h5py cannot read raises h5py's own error (OSError, RuntimeError, KeyError), as reading it would.

    Args:
        f: an open `h5py.File` (or group: its links and below).
        path: the file, for the message.
        error_class: `HDF5ReferenceError` or a subclass (e.g. one that is also the loader's own error class).
    """
    group_id = f.id
    found, failed = [], []

    def visit(name, info):
        # an exception must not cross HDF5's C iteration (h5py then reports a SystemError): kept, raised after
        try:
            if info.type != h5l.TYPE_HARD:
                found.append((name, _link_problem(group_id, name, info)))
                return True
            obj = h5o.open(group_id, name)  # a path of hard links only: the walk reached it through them
            problem = _dataset_problem(obj, name) if isinstance(obj, h5d.DatasetID) else None
        except Exception as e:  # noqa: BLE001 (re-raised below)
            failed.append(e)
            return True
        if problem:
            found.append((name, problem))
            return True
        return None

    group_id.links.visit(visit, info=True)
    if failed:
        raise failed[0]
    if found:
        name, problem = found[0]
        raise error_class(
            f"{path}: {problem}; a file from outside is read only when it holds its data itself (links to other "
            "objects or files, virtual datasets, external storage and filter plugins are refused)",
            key=_text(name),
            path=os.fspath(path),
        )


def open_self_contained(path, what="HDF5 file", error_class=ElmoTFError, reference_class=HDF5ReferenceError):
    """`h5py.File(path, "r")`, checked by `check_self_contained`.

    Raises:
        error_class: naming the file, when it is missing, a directory, truncated or not HDF5, or its links and
            dataset headers cannot be read.
        reference_class: (an `HDF5ReferenceError`) the file points outside itself; it is closed first.
    """
    if os.path.isdir(path):
        raise error_class(f"{path}: is a directory, not an HDF5 {what}", path=path)
    if not os.path.exists(path):
        raise error_class(f"{path}: no such {what}", path=path)
    try:
        f = h5py.File(path, "r")
    except _OPEN_ERRORS as e:
        raise error_class(
            f"{path}: cannot read the {what} (truncated, or not HDF5): {one_line(e)}", path=path
        ) from None
    try:
        check_self_contained(f, path, reference_class)
    except HDF5ReferenceError:
        f.close()
        raise
    except _OPEN_ERRORS as e:
        f.close()
        raise error_class(
            f"{path}: cannot read the {what}'s links and dataset headers (truncated or corrupt file?): {one_line(e)}",
            path=path,
        ) from None
    return f
