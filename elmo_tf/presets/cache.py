"""The model cache: where released models are downloaded to, verified on every use, and found offline.

Layout under the cache root (`cache_root()`: `$ELMO_TF_HOME`, else `$XDG_CACHE_HOME/elmo_tf`, else
`~/.cache/elmo_tf`):
    models/<name>/            a preset's files (options.json, weights.hdf5, ...) and manifest.json
    urls/<sha256 of URL>/     the same for a model given by URL
    downloads/<key>/          archives while they download (resumable), removed once converted
    locks/<key>.lock          one process at a time downloads or converts a model (`filelock`)
`manifest.json` (written last, atomically) records each file's size and SHA-256 and where it came from. A model is
used only when every file it needs is present and matches: the publisher's size and checksums where the registry
has them, else the manifest's record of the first complete download. A cached model never touches the network.
With `ELMO_TF_OFFLINE=1` a missing file is one error naming the model, the URL and the path to place it at.
`ELMO_TF_MIRROR` (a base URL or a directory laid out as `<host>/<path>`, as `wget -x` writes) replaces the origin of
every URL.
"""

import hashlib
import json
import logging
import os
import time
import urllib.parse

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import write_json
from elmo_tf.presets.download import DownloadError, Expected, fetch, mirrored, verify
from elmo_tf.presets.registry import Preset, PresetFile

logger = logging.getLogger(__name__)

HOME_ENV, OFFLINE_ENV, MIRROR_ENV = "ELMO_TF_HOME", "ELMO_TF_OFFLINE", "ELMO_TF_MIRROR"
MANIFEST = "manifest.json"
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")


class OfflineError(ElmoTFError):
    """A model that is not in the cache while `ELMO_TF_OFFLINE` is set."""


def cache_root(cache_dir=None):
    """The cache's root directory: `cache_dir`, else `$ELMO_TF_HOME`, else `$XDG_CACHE_HOME/elmo_tf`, else
    `~/.cache/elmo_tf` (not created here)."""
    if cache_dir:
        return os.path.abspath(os.path.expanduser(cache_dir))
    if os.environ.get(HOME_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[HOME_ENV]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "elmo_tf")


def offline():
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def url_preset(url):
    """A `Preset` for a model given by URL: an archive (.zip: ELMoForManyLangs; .tar.gz, .tgz, .tar or TF Hub's
    `?tf-hub-format=compressed`: a TF Hub module) or a directory URL holding options.json and weights.hdf5."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.lower()
    key = "url-" + hashlib.sha256(url.encode()).hexdigest()[:16]
    note = "given by URL: verified against its first complete download"
    if path.endswith(".zip"):
        files = (PresetFile("archive.zip", url, note=note),)
        return Preset(name=key, format="elmoformanylangs-zip", files=files, description=url)
    if path.endswith(ARCHIVE_SUFFIXES) or "tf-hub-format=compressed" in parts.query:
        files = (PresetFile("archive.tar.gz", url, note=note),)
        return Preset(name=key, format="tf-hub-tarball", files=files, description=url)
    base = url if url.endswith("/") else url + "/"
    files = tuple(
        PresetFile(name, urllib.parse.urljoin(base, name), note=note) for name in ("options.json", "weights.hdf5")
    )
    return Preset(name=key, format="bilm-hdf5", files=files, description=url)


def model_dir(preset, cache_dir=None):
    """Where `preset`'s usable files are (or will be) in the cache."""
    kind = "urls" if preset.name.startswith("url-") else "models"
    return os.path.join(cache_root(cache_dir), kind, preset.name)


def read_manifest(directory):
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_manifest(directory, manifest):
    write_json(os.path.join(directory, MANIFEST), manifest, sort_keys=True)


def _expected(spec, recorded):
    """What a file must be: the publisher's size and checksums, else the manifest's record of the first download."""
    size = spec.size if spec.size is not None else recorded.get("size")
    sha256 = spec.sha256 or recorded.get("sha256")
    return Expected(size=size, sha256=sha256, md5=spec.md5, sha1=spec.sha1)


def status(preset, cache_dir=None):
    """ "cached" (the manifest lists every file), "partial" (some files or a download under way) or "absent";
    without hashing anything (`elmo-tf models`)."""
    directory = model_dir(preset, cache_dir)
    manifest = read_manifest(directory).get("files", {})
    if manifest and all(os.path.exists(os.path.join(directory, name)) for name in manifest):
        return "cached"
    downloads = os.path.join(cache_root(cache_dir), "downloads", preset.name)
    if os.path.isdir(directory) or os.path.isdir(downloads):
        return "partial"
    return "absent"


def _lock(root, key):
    from filelock import FileLock, Timeout

    os.makedirs(os.path.join(root, "locks"), exist_ok=True)
    lock = FileLock(os.path.join(root, "locks", f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:  # another process holds it (a kill -9 frees it: the lock is the kernel's, on an open file)
        logger.warning("waiting for another process that is downloading %s", key)
        lock.acquire()
    return lock


def _source_url(url):
    mirror = os.environ.get(MIRROR_ENV)
    return mirrored(url, mirror) if mirror else url


def _missing(preset, spec, target):
    return OfflineError(
        f"model {preset.name!r}: {spec.name} is not in the cache and {OFFLINE_ENV} is set: download {spec.url} and "
        f"place it at {target} (or run `elmo-tf download {preset.name}` where there is a network and copy "
        f"{os.path.dirname(target)})",
        key=preset.name,
        path=target,
    )


CORE_FILES = ("options.json", "weights.hdf5")  # what a model needs; the rest (softmax.hdf5, vocab.txt) on request


def ensure(preset, cache_dir=None, quiet=True, timeout=60.0, retries=5, files=CORE_FILES):
    """The directory of `preset`'s usable files, downloading, verifying and converting what is missing; a cached
    model is only verified. `files`: the names wanted of a bilm-hdf5 preset (default options.json and weights.hdf5:
    the original's 1.6 GB softmax is fetched only for `score`); None: all of them. Archives are converted whole.

    Raises:
        DownloadError, OfflineError, ArchiveError, ConvertError: each names the model and the file.
    """
    root = cache_root(cache_dir)
    directory = model_dir(preset, cache_dir)
    lock = _lock(root, preset.name)
    try:
        if preset.converter is None:
            wanted = [f for f in preset.files if files is None or f.name in files]
            _ensure_files(preset, wanted, directory, quiet, timeout, retries)
        else:
            _ensure_converted(preset, root, directory, quiet, timeout, retries)
    finally:
        lock.release()
    return directory


def _ensure_files(preset, wanted, directory, quiet, timeout, retries):
    os.makedirs(directory, exist_ok=True)
    manifest = read_manifest(directory)
    files = manifest.setdefault("files", {})
    manifest.update(name=preset.name, format=preset.format)
    changed = False
    for spec in wanted:
        target = os.path.join(directory, spec.name)
        recorded = files.get(spec.name, {})
        expected = _expected(spec, recorded)
        what = f"model {preset.name!r}: {spec.name}"
        if os.path.exists(target):
            try:
                record = verify(target, expected, what)
            except DownloadError as e:
                raise DownloadError(
                    f"{e} (the cached file {target} does not match; delete it to download it again)", path=target
                ) from None
            if not recorded:
                record.update(url=spec.url, placed=True)
                files[spec.name], changed = record, True
            continue
        if offline():
            raise _missing(preset, spec, target)
        record = fetch(
            _source_url(spec.url), target, expected, what=what, quiet=quiet, timeout=timeout, retries=retries
        )
        record.update(url=spec.url, downloaded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        files[spec.name], changed = record, True
    if changed:
        _write_manifest(directory, manifest)


def _ensure_converted(preset, root, directory, quiet, timeout, retries):
    (spec,) = preset.files
    manifest = read_manifest(directory)
    if manifest.get("files"):
        for name, recorded in manifest["files"].items():
            target = os.path.join(directory, name)
            try:
                verify(target, Expected(recorded.get("size"), recorded.get("sha256")), f"model {preset.name!r}: {name}")
            except (DownloadError, OSError) as e:
                raise DownloadError(
                    f"{e} (the cached conversion in {directory} is damaged; delete that directory to convert again)",
                    path=target,
                ) from None
        return
    from elmo_tf.convert import ConvertError, convert
    from elmo_tf.io.atomic import remove_stale_temps, temp_name
    from elmo_tf.presets.archive import ArchiveError, extract, model_root, remove_tree

    downloads = os.path.join(root, "downloads", preset.name)
    archive = os.path.join(downloads, spec.name)
    if not os.path.exists(archive) and offline():
        raise _missing(preset, spec, archive)
    os.makedirs(downloads, exist_ok=True)
    recorded = read_manifest(downloads).get("files", {}).get(spec.name, {})
    expected = _expected(spec, recorded)
    what = f"model {preset.name!r}: {spec.name}"
    if os.path.exists(archive):  # downloaded whole by an earlier run that ended before converting it
        record = verify(archive, expected, what)
    else:
        record = fetch(
            _source_url(spec.url), archive, expected, what=what, quiet=quiet, timeout=timeout, retries=retries
        )
    if not recorded:  # the first complete download: what later uses are held to
        _write_manifest(downloads, {"files": {spec.name: {**record, "url": spec.url}}})
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(parent)
    unpacked = temp_name(os.path.join(parent, f"{preset.name}-unpacked"))
    converted = temp_name(directory)
    try:
        os.makedirs(unpacked)
        extract(archive, unpacked)
        marker = "config.json" if preset.converter == "elmoformanylangs" else "tfhub_module.pb"
        source = model_root(unpacked, marker)
        if source is None:
            raise ArchiveError(f"{archive}: holds no single model directory with {marker}", path=archive)
        logger.info("converting %s (%s) into %s", preset.name, preset.converter, directory)
        convert(preset.converter, source, converted)
        files = {}
        for name in sorted(os.listdir(converted)):
            files[name] = verify(os.path.join(converted, name), Expected(), name)
        _write_manifest(
            converted,
            {"name": preset.name, "format": preset.format, "files": files, "archive": {**record, "url": spec.url}},
        )
        if os.path.isdir(directory):
            remove_tree(directory)  # a directory without a manifest: an earlier conversion never finished
        os.rename(converted, directory)
    except (ArchiveError, ConvertError) as e:
        raise _name_archive(e, f"{what} ({spec.url})", archive, unpacked, converted) from None
    finally:
        remove_tree(unpacked)
        remove_tree(converted)
    remove_tree(downloads)  # the conversion (and the archive's checksum, in its manifest) is what is kept


def _name_archive(error, what, archive, unpacked, converted):
    """`error` (an ArchiveError or ConvertError of unpacking `archive` into `unpacked` or converting it into
    `converted`) with a message that names the archive (`what`: the model, the file and its URL) and the member,
    never those temporary directories: they are removed once the error leaves. Its `path` is the archive's (kept,
    verified, in the downloads directory) when it was inside them."""
    message = str(error)
    for temporary, name in ((unpacked, "member "), (converted, "the conversion's ")):
        message = message.replace(temporary + os.sep, name).replace(temporary, name.strip())
    error.args = (f"{what}: {message}",)
    if error.path is not None and os.fspath(error.path).startswith((unpacked, converted)):
        error.path = archive
    return error
