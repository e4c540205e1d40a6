"""Converters from other ELMo formats to ours: `options.json` + `weights.hdf5` (bilm-tf/AllenNLP layout, which
`elmo_tf.io.bilm_hdf5` reads) + `softmax.hdf5` (`softmax/W`, `softmax/b`, the released `*_softmax_weights.hdf5`
layout) when the source has a softmax, + whatever else a source needs (vocabularies, `scalar_mix.json`).

Sources (`SOURCES`, the `--from` of `elmo-tf convert`), each a module with one function
`convert(src_dir, out_dir, **options) -> list of written paths`:
    elmoformanylangs     an ELMoForManyLangs (HIT-SCIR) model dir          elmo_tf.convert.elmoformanylangs
    bilm-tf-checkpoint   a bilm-tf training dir (TF1 Saver V2 checkpoint)  elmo_tf.convert.bilm_tf_checkpoint
    tf-hub               the TF Hub google/elmo module dir (TF1 format)    elmo_tf.convert.tf_hub
A source module writes its files into `out_dir`, an existing empty directory; `convert` below gives it a hidden
temporary one beside the output and renames it at the end, so an output is there whole or not at all.

Importing this package loads no TensorFlow (the source modules are imported when used).

Example:
    from elmo_tf.convert import convert
    convert("bilm-tf-checkpoint", "runs/my_bilm", "converted/")   # -> [".../options.json", ".../weights.hdf5", ...]
"""

import importlib
import os
import shutil

from elmo_tf.errors import ElmoTFError, not_a_regular_file

__all__ = ["SOURCES", "ConvertError", "UnavailableSourceError", "convert", "is_regular_file", "source_module"]

# --from name -> (module, what the source is, the keyword options its convert takes)
SOURCES = {
    "elmoformanylangs": ("elmo_tf.convert.elmoformanylangs", "an ELMoForManyLangs model dir", ()),
    "bilm-tf-checkpoint": (
        "elmo_tf.convert.bilm_tf_checkpoint",
        "a bilm-tf training dir (model.ckpt-*.index, options.json)",
        ("options",),
    ),
    "tf-hub": (
        "elmo_tf.convert.tf_hub",
        "the TF Hub google/elmo module dir (tfhub_module.pb, variables/)",
        ("options",),
    ),
}


class ConvertError(ElmoTFError):
    """A source that cannot be converted: a missing file, an empty checkpoint, shapes that disagree. The message
    names the file and what was expected."""


class UnavailableSourceError(ConvertError):
    """A source whose converter module is not part of this installation."""


def is_regular_file(path, expected, error=ConvertError):
    """True when `path` is (a link to) a regular file, False when nothing is there; raises `error` naming `path`, what
    it is and `expected` when it is something else: a FIFO or a device would block the read forever or misread, a
    directory is no file."""
    what = not_a_regular_file(path)
    if what is None:
        return True
    if what == "no such file":
        return False
    raise error(f"{path}: {what}; expected {expected}", path=str(path))


def source_module(name):
    """The converter module of source `name` (imported now).

    Raises:
        ConvertError: an unknown name (key "source").
        UnavailableSourceError: a known source whose module is not installed.
    """
    if name not in SOURCES:
        raise ConvertError(f"unknown source {name!r}; expected one of {', '.join(SOURCES)}", key="source")
    module = SOURCES[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # a dependency of the converter is missing: that is not "no converter"
            raise
        raise UnavailableSourceError(
            f"{name}: this elmo_tf has no converter for it yet (no module {module})", key="source"
        ) from None


def convert(source, src_dir, out_dir, **options):
    """Converts the model in `src_dir` (of kind `source`, a key of `SOURCES`) into `out_dir`, atomically.

    Args:
        source: "elmoformanylangs", "bilm-tf-checkpoint" or "tf-hub".
        src_dir: the source directory.
        out_dir: the output directory: new, or an empty directory (replaced), never `src_dir`.
        **options: the source's own options (`SOURCES[source][2]`; e.g. `options="options.json"`); None values
            are dropped.
    Returns:
        the written paths, inside `out_dir`.
    Raises:
        ConvertError (an ElmoTFError): the source cannot be converted, or `out_dir` cannot take the output; then
            nothing is written (the temporary directory is removed).
    """
    module = source_module(source)
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - set(SOURCES[source][2]))
    if unknown:
        raise ConvertError(f"{source}: takes no option {', '.join(unknown)}", key=unknown[0])
    check_output_dir(src_dir, out_dir)
    from elmo_tf.io.atomic import make_public_dir, remove_stale_temps, temp_name

    # a link to an empty directory is written through: the rename replaces the directory it points to
    target = os.path.realpath(out_dir) if os.path.islink(out_dir) else os.path.abspath(out_dir)
    parent = os.path.dirname(target)
    made = None  # the outermost parent directory made here, removed again on an error
    ancestor = parent
    while not os.path.exists(ancestor):
        made, ancestor = ancestor, os.path.dirname(ancestor)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(parent, os.path.basename(target))
    tmp = temp_name(target)
    try:
        make_public_dir(tmp)
        written = [os.path.join(tmp, path) for path in module.convert(src_dir, tmp, **options)]
        try:
            os.rename(tmp, target)  # replaces an empty directory (POSIX rename), never a non-empty one
        except OSError as e:
            raise ConvertError(f"{out_dir}: cannot be written: {e.strerror}", key="output", path=out_dir) from None
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return [os.path.join(os.path.abspath(out_dir), os.path.relpath(path, tmp)) for path in written]


def check_output_dir(src_dir, out_dir):
    """Raises `ConvertError` (key "output") unless `out_dir` can take a conversion of `src_dir`: it is not `src_dir`
    (nor a file), and it does not exist or is an empty directory."""
    if not os.path.isdir(src_dir):
        raise ConvertError(f"{src_dir}: not a directory", key="source", path=src_dir)
    if os.path.exists(out_dir):
        if os.path.samefile(out_dir, src_dir):
            raise ConvertError(f"{out_dir}: is the source directory; give a new one", key="output", path=out_dir)
        if not os.path.isdir(out_dir):
            raise ConvertError(f"{out_dir}: exists and is not a directory", key="output", path=out_dir)
        if os.listdir(out_dir):
            raise ConvertError(f"{out_dir}: exists and is not empty; give a new directory", key="output", path=out_dir)
