"""The released ELMo models, as data: `registry.json` in this package, read into `Preset`s.

Each entry names a model (`"original"`, `"efml-de"`, `"tf-hub"`, ...) and lists its files with their URLs, sizes
and checksums where the publisher gave them, copied from the projects' own READMEs and pages (each file's `note`
says where; what could not be confirmed is null, with a note). `format` says what the files are:
    bilm-hdf5             options.json + weights.hdf5 (+ softmax.hdf5 and vocab.txt for `score`), used as they are
    elmoformanylangs-zip  one zip of an ELMoForManyLangs model dir, converted with `elmo_tf.convert`
    tf-hub-tarball        the TF1 Hub module as a .tar.gz, converted with `elmo_tf.convert`
Where no checksum is published, the cache records the size and SHA-256 of the first complete download and checks
every later use against them (`elmo_tf.presets.cache`).
"""

import dataclasses
import functools
import json
import os
import urllib.parse

from elmo_tf.errors import ElmoTFError, one_line

FORMATS = {
    "bilm-hdf5": None,  # used as downloaded
    "elmoformanylangs-zip": "elmoformanylangs",  # -> the elmo_tf.convert source that converts the unpacked archive
    "tf-hub-tarball": "tf-hub",
}
REGISTRY_ENV = "ELMO_TF_REGISTRY"
REGISTRY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "registry.json")


class RegistryError(ElmoTFError):
    """A registry entry that breaks the form (a file without a URL, an unknown format, ...)."""


@dataclasses.dataclass(frozen=True)
class PresetFile:
    """One file of a preset: its name in the model's directory, where to get it, and what it must be."""

    name: str
    url: str
    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    sha1: str | None = None
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """A released model: `files` by name, and what the publisher says of it."""

    name: str
    format: str
    files: tuple
    description: str = ""
    language: str | None = None
    parameters: int | None = None
    training_data: str | None = None
    source: str | None = None
    homepage: str | None = None
    license: str | None = None
    note: str | None = None

    @property
    def size(self):
        """Total bytes of its files, or None when a size is unknown."""
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)

    @property
    def converter(self):
        """The `elmo_tf.convert` source that turns its archive into options.json + weights.hdf5, or None."""
        return FORMATS[self.format]


_HEX = {"sha256": 64, "md5": 32, "sha1": 40}


def _check_file(model, name, entry):
    where = f"registry {model!r}, file {name!r}"
    if not isinstance(entry, dict):
        raise RegistryError(f"{where}: expected an object", key=model)
    url = entry.get("url")
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise RegistryError(f"{where}: 'url' must be an http(s) URL, got {url!r}", key=model)
    size = entry.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise RegistryError(f"{where}: 'size' must be a positive int or null, got {size!r}", key=model)
    for algorithm, length in _HEX.items():
        value = entry.get(algorithm)
        if value is not None and (
            not isinstance(value, str) or len(value) != length or any(c not in "0123456789abcdef" for c in value)
        ):
            raise RegistryError(f"{where}: {algorithm!r} must be {length} lowercase hex digits or null", key=model)
    if size is None and not entry.get("note"):
        raise RegistryError(f"{where}: a file without a size needs a 'note' saying why", key=model)
    if not name or os.path.basename(name) != name or name.startswith("."):
        raise RegistryError(f"{where}: a file name, not a path", key=model)
    unknown = set(entry) - {"url", "size", "sha256", "md5", "sha1", "note"}
    if unknown:
        raise RegistryError(f"{where}: unknown keys {sorted(unknown)}", key=model)
    return PresetFile(name=name, **entry)


def parse_registry(data):
    """`{name: Preset}` from the registry's JSON object; `RegistryError` names the entry that breaks the form."""
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("models"), dict):
        raise RegistryError("registry: expected {'format': 1, 'models': {...}}")
    presets = {}
    for name, entry in data["models"].items():
        if not isinstance(entry, dict):
            raise RegistryError(f"registry {name!r}: expected an object", key=name)
        if not name or name != name.strip() or "/" in name or os.sep in name or name.startswith("."):
            raise RegistryError(f"registry {name!r}: not a usable model name", key=name)
        if entry.get("format") not in FORMATS:
            raise RegistryError(f"registry {name!r}: 'format' must be one of {sorted(FORMATS)}", key=name)
        files = entry.get("files")
        if not isinstance(files, dict) or not files:
            raise RegistryError(f"registry {name!r}: 'files' must list at least one file", key=name)
        checked = tuple(_check_file(name, file_name, spec) for file_name, spec in files.items())
        names = {f.name for f in checked}
        if entry["format"] == "bilm-hdf5" and not {"options.json", "weights.hdf5"} <= names:
            raise RegistryError(f"registry {name!r}: a bilm-hdf5 model needs options.json and weights.hdf5", key=name)
        if entry["format"] != "bilm-hdf5" and len(checked) != 1:
            raise RegistryError(f"registry {name!r}: an archive format has exactly one file", key=name)
        known = {f.name for f in dataclasses.fields(Preset)} - {"name"}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise RegistryError(f"registry {name!r}: unknown keys {unknown}", key=name)
        fields = dict(entry)
        presets[name] = Preset(**{**fields, "name": name, "files": checked})
    return presets


@functools.cache
def _package_presets():
    with open(REGISTRY_PATH, encoding="utf-8") as f:
        return parse_registry(json.load(f))


def read_registry(path):
    """`{name: Preset}` of a registry file of the same form (`RegistryError` names the file)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RegistryError(
            f"{path}: not a readable registry JSON: {one_line(e)}", key=REGISTRY_ENV, path=path
        ) from None
    try:
        return parse_registry(data)
    except RegistryError as e:
        raise RegistryError(f"{path}: {e}", key=REGISTRY_ENV, path=path) from None


def presets():
    """`{name: Preset}`: the package's registry.json, plus (overriding same names) the entries of the file that
    `$ELMO_TF_REGISTRY` names: a site's own models, or a test's."""
    merged = dict(_package_presets())
    extra = os.environ.get(REGISTRY_ENV)
    if extra:
        merged.update(read_registry(extra))
    return merged
