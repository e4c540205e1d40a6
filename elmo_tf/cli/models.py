"""`elmo-tf models` (the released models and what the cache holds), `elmo-tf download NAME...` (prefetch, for a
machine that goes offline later), and the model flags every command shares: `--model NAME|DIR|URL` (embed,
dump-token-embeddings, score, export's --model-dir) and `--elmo NAME|DIR|URL` (train-ner, tune-ner, tag,
export-tagger) take a released model's name or a URL where they took a directory (`elmo_tf.presets`).

    elmo-tf models
    elmo-tf download original efml-de --cache-dir /data/elmo_cache
    elmo-tf embed --model original --input sentences.txt --output out.hdf5
"""

import argparse
import json
import os
import sys

from elmo_tf.cli import ArgumentParser, DataError, UsageError, setup_logging
from elmo_tf.errors import ElmoTFError

MODELS_PROG, DOWNLOAD_PROG = "elmo-tf models", "elmo-tf download"
MODEL_HELP = (
    "a released model's name (`elmo-tf models`), a directory holding options.json and weights.hdf5, or a URL of "
    "one (or of an ELMoForManyLangs .zip / TF Hub .tar.gz): names and URLs are downloaded once into the cache"
)
CACHE_HELP = "the cache directory (default $ELMO_TF_HOME, else $XDG_CACHE_HOME/elmo_tf, else ~/.cache/elmo_tf)"


def resolve_model(flag, value, roles=(), quiet=False):
    """`{role: path}` (options, weights, and those of `roles` the model has: softmax, vocab) of the model `value`
    of `flag`: a name or a URL is fetched into the cache, a directory used as it is. UsageError for an unknown name
    or a directory without the files; DataError for a download that failed (each names the flag)."""
    from elmo_tf.presets import PresetError, preset_files

    try:
        return preset_files(value, quiet=quiet, roles=roles)
    except PresetError as e:
        raise UsageError(f"{flag}: {e}") from None
    except ElmoTFError as e:  # a download, a checksum, offline, an archive, a conversion
        raise DataError(f"{flag}: {e}") from None


def resolve_elmo_flag(args, quiet=False):
    """Replaces `args.elmo`, when it is a released model's name or a URL, by the cached model's directory (which the
    NER commands take as they take a pretraining run's)."""
    from elmo_tf.presets import is_preset

    if getattr(args, "elmo", None) and is_preset(args.elmo):
        files = resolve_model("--elmo", args.elmo, quiet=quiet)
        args.elmo = os.path.dirname(files["weights"])


def _size(preset):
    size = preset.size
    if size is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000


def build_models_parser(prog=MODELS_PROG):
    p = ArgumentParser(
        prog=prog,
        description="List the released ELMo models elmo_tf can download by name, and whether the cache holds them.",
        epilog="examples:\n  elmo-tf models\n  elmo-tf models --json | jq '.[].name'\n"
        "then: elmo-tf download NAME, or any --model NAME",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cache-dir", help=CACHE_HELP)
    p.add_argument("--json", action="store_true", help="one JSON list (every field of the registry) instead of a table")
    return p


def main(argv=None, prog=MODELS_PROG):
    """`models`; returns the exit status."""
    args = build_models_parser(prog).parse_args(argv)
    from elmo_tf.presets import cache_root, presets, status

    try:
        known = presets()
    except ElmoTFError as e:
        raise DataError(str(e)) from None
    rows = []
    for name, preset in sorted(known.items()):
        rows.append(
            {
                "name": name,
                "size": preset.size,
                "language": preset.language,
                "format": preset.format,
                "source": preset.source,
                "cache": status(preset, args.cache_dir),
                "description": preset.description,
                "files": {f.name: {"url": f.url, "size": f.size} for f in preset.files},
            }
        )
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    header = ("name", "size", "lang", "cache", "description")
    table = [(r["name"], _size(known[r["name"]]), r["language"] or "?", r["cache"], r["description"]) for r in rows]
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(4)]
    for row in [header, *table]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + str(row[4]))
    print(f"\ncache: {cache_root(args.cache_dir)}   (size ?: not published; checked against the first download)")
    return 0


def build_download_parser(prog=DOWNLOAD_PROG):
    p = ArgumentParser(
        prog=prog,
        description="Download released ELMo models (and convert those not in bilm-tf's format) into the cache, so a "
        "machine can use them offline later (ELMO_TF_OFFLINE=1). An interrupted download resumes.",
        epilog="examples:\n  elmo-tf download original\n  elmo-tf download small efml-de --cache-dir /data/elmo\n"
        "  ELMO_TF_MIRROR=https://mirror.example/elmo elmo-tf download original   # an air-gapped site's mirror",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="+", metavar="NAME", help="a released model's name (`elmo-tf models`) or a URL")
    p.add_argument("--cache-dir", help=CACHE_HELP)
    p.add_argument(
        "--all-files",
        action="store_true",
        help="also the softmax and vocabulary where published (for `score`; the original's softmax is large)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def download_main(argv=None, prog=DOWNLOAD_PROG):
    """`download`; returns the exit status."""
    args = build_download_parser(prog).parse_args(argv)
    from elmo_tf.presets import PresetError, download, get_preset

    for name in args.names:
        try:
            get_preset(name)  # every name is checked before anything is downloaded
        except PresetError as e:
            raise UsageError(f"NAME: {e}") from None
    setup_logging(quiet=args.quiet)
    for name in args.names:
        try:
            (directory,) = download([name], cache_dir=args.cache_dir, quiet=args.quiet, all_files=args.all_files)
        except ElmoTFError as e:
            raise DataError(str(e)) from None
        print(f"{name}\t{directory}")
    return 0
