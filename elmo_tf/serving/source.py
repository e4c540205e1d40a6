"""The version source: a model's base path read as TF Serving's file-system source reads it
(`tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc`), and a fingerprint of a version's files.

    - a child of the base path is a version when its name parses to an int64 (`ParseVersionNumber`, i.e.
      `strings::safe_strto64`): "007" is version 7; a number above 2**63 - 1 ("99999999999999999999") is not a
      version and is ignored. Stricter than `safe_strto64`: only ASCII digits count (it also takes a sign and
      surrounding spaces: "-1", " 7"); other names are ignored, each logged once while it stays on disk. The export
      reads names the same way (`elmo_tf.saved_model.versions.parse_version`);
    - two names for one number ("7" and "007"): as `IndexChildrenByVersion`, the name that sorts last wins ("7",
      i.e. the fewest leading zeros), with one warning;
    - unlike TF Serving, a version counts only once it holds `saved_model.pb` (or `.pbtxt`), so a directory being
      written is not a failed load; hidden names (an export's temporaries) are left out.
    - the model's version policy (`config_files.VersionPolicy`) picks the candidates among the versions on disk, as
      the source's Aspire*Versions do (file_system_storage_path_source.cc `AspireAllVersions`, `AspireLatestVersions`,
      `AspireSpecificVersions`): `latest { num_versions: N }` all of them, highest first (stock aspires the N highest;
      the manager serves the N highest that load), `all {}` all, `specific { versions }` the listed ones on disk. A
      listed version absent from disk is logged with stock's warning (`AspireSpecificVersions`), once while it stays
      absent (stock repeats it every poll); an empty `specific {}` with stock's "No specific versions requested for
      servable m." (`AspireSpecificVersionsFastPath`), once.
What the manager does with the candidates (load, retry, retire) is `elmo_tf.serving.manager`'s.
"""

import logging
import os

from elmo_tf.saved_model.versions import parse_version
from elmo_tf.serving.config_files import VersionPolicy

logger = logging.getLogger(__name__)

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def versions_on_disk(base_path):
    """`({version: directory name}, {ignored name: why})` for the children of `base_path`: the versions that hold a
    SavedModel, and the names that are not read as versions (hidden names, such as an export's temporaries, are
    left out of both)."""
    try:
        names = sorted(os.listdir(base_path))
    except OSError:
        return {}, {}
    versions, ignored = {}, {}
    for name in names:  # sorted: of two names for one number, the last wins, as in TF Serving
        version = parse_version(name)
        if version is None:
            if not name.startswith("."):
                digits = name.isascii() and name.isdigit()
                ignored[name] = "a number above 2**63 - 1" if digits else "not a version number"
        elif any(os.path.isfile(os.path.join(base_path, name, f)) for f in SAVED_MODEL_FILES):
            if version in versions:
                ignored[versions[version]] = f"version {version} is read from {name!r}"
            versions[version] = name
    return versions, ignored


def files_fingerprint(path, limit=10000):
    """A hash of the names, sizes and modification times of the files under `path` (at most `limit` of them)."""
    entries = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            entries.append((os.path.relpath(os.path.join(root, name), path), st.st_size, st.st_mtime_ns))
            if len(entries) >= limit:
                return hash(tuple(entries))
    return hash(tuple(entries))


class FileSystemSource:
    """The versions under one model's base path, polled, and those its version policy serves.

    Args:
        name: the model name (for the log).
        base_path: the directory holding `<version>/saved_model.pb`.
        policy: `config_files.VersionPolicy` (None: latest 1).
    """

    def __init__(self, name, base_path, policy=None):
        self.name = name
        self.base_path = os.path.abspath(base_path)
        self.policy = policy if policy is not None else VersionPolicy()
        self._logged_names = set()
        self._warned_empty = False
        self._absent = set()  # specific versions absent from disk, warned about
        if self.policy.kind == "specific" and not self.policy.versions:
            logger.warning("No specific versions requested for servable %s.", name)

    def poll(self):
        """`{version: path}` of the versions on disk now. Names it ignores are logged once while they stay on disk,
        an empty base path once until versions appear, a specific version of the policy once while it is absent."""
        versions, ignored = versions_on_disk(self.base_path)
        for name in sorted(set(ignored) - self._logged_names):
            logger.warning("ignoring %r under the base path of %s: %s", name, self.name, ignored[name])
        self._logged_names = set(ignored)
        if not versions:
            if not self._warned_empty:
                logger.warning("No versions of servable %s found under base path %s", self.name, self.base_path)
                self._warned_empty = True
        else:
            self._warned_empty = False
        self._warn_absent(versions)
        return {version: os.path.join(self.base_path, name) for version, name in versions.items()}

    def _warn_absent(self, versions):
        absent = {v for v in self.policy.versions if v not in versions} if self.policy.kind == "specific" else set()
        for version in sorted(absent - self._absent):
            logger.warning(
                "Version %d of servable %s, which was requested to be served as a 'specific' version in the "
                "servable's version policy, was not found in the file system",
                version,
                self.name,
            )
        self._absent = absent

    def candidates(self, versions):
        """`(candidates, count)`: the versions of `versions` (on disk) the policy may serve, highest first, and how
        many of them are served: under `latest N` every version and N (stock aspires the first N), under `all` and
        `specific` the versions it selects and all of them."""
        ordered = sorted(versions, reverse=True)
        if self.policy.kind == "latest":
            return ordered, self.policy.num_versions
        if self.policy.kind == "specific":
            listed = set(self.policy.versions)
            ordered = [v for v in ordered if v in listed]
        return ordered, len(ordered)
