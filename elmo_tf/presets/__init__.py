"""Released ELMo models by name, downloaded once, verified, resumable, offline: keras-hub's presets for ELMo.

A preset is one of three things, resolved here and nowhere else:
    a name of the registry   "original", "small", "efml-de", "tf-hub", ... (`elmo-tf models` lists them)
    a local directory        holding options.json and weights.hdf5 (used as it is)
    a URL                    of a directory holding options.json and weights.hdf5, or of an archive (an
                             ELMoForManyLangs .zip, a TF Hub .tar.gz), downloaded and converted like a name's
Downloads go to the cache (`elmo_tf.presets.cache`; `$ELMO_TF_HOME`, else `$XDG_CACHE_HOME/elmo_tf`, else
`~/.cache/elmo_tf`): into a temporary file, verified, then renamed; resumed with HTTP Range after an interruption;
one process at a time per model (a file lock); a cached model never touches the network. Importing this package
loads no TensorFlow.

Example:
    from elmo_tf.presets import preset_files
    files = preset_files("original")   # {"options": ".../options.json", "weights": ".../weights.hdf5", ...}
    elmo = elmo_tf.load_elmo("original")   # the same, then the model
"""

import os

from elmo_tf.errors import ElmoTFError
from elmo_tf.presets.cache import CORE_FILES, OfflineError, cache_root, ensure, status, url_preset
from elmo_tf.presets.download import DownloadError
from elmo_tf.presets.registry import Preset, PresetFile, RegistryError, presets

__all__ = [
    "DownloadError",
    "OfflineError",
    "Preset",
    "PresetError",
    "PresetFile",
    "RegistryError",
    "cache_root",
    "download",
    "get_preset",
    "is_preset",
    "preset_dir",
    "preset_files",
    "presets",
    "status",
]

# the files of a model directory that loaders use, by role
ROLES = {"options": "options.json", "weights": "weights.hdf5", "softmax": "softmax.hdf5", "vocab": "vocab.txt"}


class PresetError(ElmoTFError):
    """A preset that is neither a local directory, a URL nor a registry name."""


def is_url(text):
    return isinstance(text, str) and text.lower().startswith(("http://", "https://"))


def is_preset(text):
    """True when `text` is a registry name or a URL (what `preset_dir` downloads), not a local path."""
    return isinstance(text, str) and not os.path.exists(text) and (is_url(text) or text in presets())


def get_preset(name):
    """The registry's `Preset` called `name`, or a `Preset` for a URL; `PresetError` lists the names otherwise."""
    if is_url(name):
        return url_preset(name)
    known = presets()
    if name not in known:
        raise PresetError(
            f"preset {name!r}: not a local directory, a URL or a released model name; known names: "
            f"{', '.join(sorted(known))} (`elmo-tf models` describes them)",
            key="preset",
        )
    return known[name]


def preset_dir(preset, cache_dir=None, quiet=True, timeout=60.0, retries=5, files=CORE_FILES):
    """The local directory of `preset` (a name, a local directory or a URL), downloaded and converted into the
    cache first when needed (`files`: the file names wanted, None for all; see `elmo_tf.presets.cache.ensure`).

    Raises:
        PresetError: an unknown name; DownloadError, OfflineError, ArchiveError, ConvertError: a model that could
            not be fetched or used (each names the model, the file and what to do).
    """
    preset = os.fspath(preset)
    if os.path.isdir(preset):
        return preset
    if os.path.exists(preset):
        raise PresetError(f"preset {preset!r}: a file; expected a model directory, a name or a URL", key="preset")
    return ensure(get_preset(preset), cache_dir=cache_dir, quiet=quiet, timeout=timeout, retries=retries, files=files)


def preset_files(preset, cache_dir=None, quiet=True, roles=("options", "weights")):
    """`{role: path}` of the files `preset`'s directory holds (roles: options, weights, softmax, vocab), after
    fetching those of `roles`; options and weights are always there (else `PresetError`)."""
    wanted = {ROLES[role] for role in ("options", "weights", *roles)}
    directory = preset_dir(preset, cache_dir=cache_dir, quiet=quiet, files=wanted)
    files = {role: os.path.join(directory, name) for role, name in ROLES.items()}
    files = {role: path for role, path in files.items() if os.path.isfile(path)}
    missing = [ROLES[role] for role in ("options", "weights") if role not in files]
    if missing:
        raise PresetError(f"preset {preset!r}: {directory} holds no {' and no '.join(missing)}", key="preset")
    return files


def download(names, cache_dir=None, quiet=False, all_files=False):
    """Downloads (and converts) each preset of `names` into the cache, for a machine that goes offline later
    (`all_files`: also the softmax and vocabulary where published, for `score`); returns their directories."""
    files = None if all_files else CORE_FILES
    return [preset_dir(name, cache_dir=cache_dir, quiet=quiet, files=files) for name in names]
