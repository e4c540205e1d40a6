"""What an export of elmo_tf records about itself: `<version>/assets.extra/elmo_tf.json`.

TF Serving reads from `assets.extra/` its warmup file only (`elmo_tf.saved_model.warmup`; and, with
--enable_saved_model_config, `saved_model_config.pb`); any other file there travels with the version and is ignored
by the stock server and by the C++ loader. elmo_tf's exports (`export_elmo`, the NER tagger's `export_tagger`) write
this one, a JSON object:

    format      1 (this layout)
    exporter    "elmo" or "ner_tagger"
    precision   what the export's biLM computes in: "float32" or "bfloat16" (`elmo_tf.precision`); the graph holds
                the bfloat16 copies of the weights and casts nowhere else, so any loader runs it in that precision
    tokenizer   the in-graph tokenizer of the sentence signatures ("whitespace", "unicode_script")
    max_tokens  the export's cut of every sentence (null: none)
    elmo_tf     the version of elmo_tf that wrote it

The embedded model server logs it when it loads a version (`elmo_tf.serving.servable`), and `read_export_metadata`
reads it back (a version without it, written before exports recorded it: `{}`).
"""

import json
import os

from elmo_tf.errors import ElmoTFError
from elmo_tf.saved_model.warmup import WARMUP_DIR

METADATA_FILE = "elmo_tf.json"
METADATA_FORMAT = 1


class MetadataError(ElmoTFError):
    """An export's `assets.extra/elmo_tf.json` that cannot be read as one (the message names the file)."""


def metadata_path(export_dir):
    """`<export_dir>/assets.extra/elmo_tf.json`."""
    return os.path.join(export_dir, WARMUP_DIR, METADATA_FILE)


def export_metadata(exporter, precision, tokenizer="whitespace", max_tokens=None):
    """The metadata of an export (see the module docstring) as a dict."""
    from elmo_tf import __version__

    return {
        "format": METADATA_FORMAT,
        "exporter": exporter,
        "precision": str(precision),
        "tokenizer": tokenizer,
        "max_tokens": max_tokens,
        "elmo_tf": __version__,
    }


def write_export_metadata(export_dir, metadata):
    """Writes `metadata` (`export_metadata`) to `metadata_path(export_dir)` (into a SavedModel being written, before it
    is published: `publish_version` makes the whole version appear at once); returns the path."""
    path = metadata_path(export_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def read_export_metadata(export_dir):
    """The metadata of the export at `export_dir` ({} for one without the file); MetadataError for a file that is not
    a JSON object."""
    path = metadata_path(export_dir)
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise MetadataError(f"{path}: not elmo_tf's export metadata ({e})", path=path) from None
    if not isinstance(metadata, dict):
        raise MetadataError(f"{path}: not a JSON object", path=path)
    return metadata


__all__ = [
    "METADATA_FILE",
    "MetadataError",
    "export_metadata",
    "metadata_path",
    "read_export_metadata",
    "write_export_metadata",
]
