"""What a downloaded file must be before it is put in place, and the one error of a download.

`Expected` holds what is known of a file (its size, its SHA-256 / MD5 / SHA-1); `verify` checks a file against it
in one pass over its bytes. A file nobody publishes a size for is bounded by the ceiling `MAX_DOWNLOAD_BYTES`
(`$ELMO_TF_MAX_DOWNLOAD_BYTES`, read by `max_download_bytes`). `DownloadError` is what ends every download that
fails (`elmo_tf.presets.download.fetch`): one line naming the file, the URL and what to do.
"""

import hashlib
import os

from elmo_tf.errors import ElmoTFError, one_line

CHUNK = 1 << 20  # hashing
HASHES = ("sha256", "md5", "sha1")
MAX_DOWNLOAD_ENV = "ELMO_TF_MAX_DOWNLOAD_BYTES"
# The ceiling on a file whose size no one publishes. The largest released ELMo file is the original model's softmax
# (about 1.6 GB; its weights about 360 MB, the TF Hub tarball about 350 MB): 4 GiB leaves room and still stops a
# server without end before it fills a disk.
MAX_DOWNLOAD_BYTES = 4 << 30
NETWORK_HINT = (
    "check the URL and the network, or set ELMO_TF_MIRROR to a copy of the files (ELMO_TF_OFFLINE=1 uses the cache "
    "only)"
)


class DownloadError(ElmoTFError):
    """A file that could not be downloaded or did not verify. Nothing of it is left under its final name."""


class Expected:
    """What a downloaded file must be: `size` in bytes and hex digests (`sha256`, `md5`, `sha1`), each None when
    unknown. `digests()`: the known digests, lowercase, by name."""

    def __init__(self, size=None, sha256=None, md5=None, sha1=None):
        self.size = size
        self.sha256, self.md5, self.sha1 = sha256, md5, sha1

    def digests(self):
        return {name: getattr(self, name).lower() for name in HASHES if getattr(self, name)}


def file_digests(path, names=HASHES):
    """`{name: hex digest}` of `path`'s bytes for each hash in `names` (one pass)."""
    hashers = {name: hashlib.new(name) for name in names}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def verify(path, expected, what):
    """`{"size", "sha256"}` of `path`, or `DownloadError` when its size or a digest differs from `expected`."""
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        raise DownloadError(f"{what}: {size} bytes, expected {expected.size}: refused, nothing cached", path=path)
    wanted = expected.digests()
    digests = file_digests(path, sorted({"sha256", *wanted}))
    for name, value in wanted.items():
        if digests[name] != value:
            raise DownloadError(
                f"{what}: {name} {digests[name]}, expected {value}: refused, nothing cached (a corrupt or changed "
                "download)",
                path=path,
            )
    return {"size": size, "sha256": digests["sha256"]}


def max_download_bytes():
    """The ceiling on a file whose size no one publishes: `$ELMO_TF_MAX_DOWNLOAD_BYTES`, else `MAX_DOWNLOAD_BYTES`;
    `DownloadError` (one line naming the variable and its value) when it is not a positive integer."""
    text = os.environ.get(MAX_DOWNLOAD_ENV)
    if text is None or not text.strip():
        return MAX_DOWNLOAD_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise DownloadError(
            f"{MAX_DOWNLOAD_ENV} must be a positive integer (bytes), got {text!r}", key=MAX_DOWNLOAD_ENV
        )
    return value


def short(text, limit=200):
    """`text` on one line, cut to `limit` characters (a URL or an error quoted in a message)."""
    text = one_line(text)
    return text if len(text) <= limit else text[:limit] + "..."
