"""`merge-shards`: `elmo-tf merge-shards --input PREFIX --output out.hdf5` (`elmo_tf.io.embeddings_shards`).

Shards that are not one run's complete set are refused with one line (exit 1), before anything is written: shards
of different runs (their fingerprints differ: model, layers, dtype, precision, input, settings) or of different
sets, a shard missing or given twice (each names the file, the attribute and both values), line indices in two
shards or in none (the file and the index), and shards without a fingerprint (written before beam-embed marked its
shards: run it again). An output that cannot be written (its directory missing, not a directory, not writable)
is one line too (exit 2 when seen before the merge, 1 when met while writing), and nothing of it is left.
"""

import argparse
import errno
import glob
import logging
import os

from elmo_tf.cli import ArgumentParser, DataError, UsageError, check_output_file
from elmo_tf.cli.progress import Progress, add_progress_flags

PROG = "elmo-tf merge-shards"

EXAMPLES = """examples:
  elmo-tf merge-shards --input out/emb --output all.hdf5          # out/emb-SSSSS-of-NNNNN.hdf5
  elmo-tf merge-shards --input a-00000-of-00002.hdf5 a-00001-of-00002.hdf5 --output all.hdf5

output: the `elmo-tf embed` output of the whole input: every shard's datasets (copied as stored) and one
sentence_to_index (a key of several lines maps to the last, as embed writes it). The shards must be one
beam-embed run's complete set: each carries its run's fingerprint (root attributes run.*) and its place
(shard.index, shard.count).
"""


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description="Merge the shards of `elmo-tf beam-embed` into one embed output file.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--input", required=True, nargs="+", help="the shard prefix (PREFIX-SSSSS-of-NNNNN.hdf5), or the shard files"
    )
    p.add_argument("--output", required=True, help="hdf5 file to write (replaced whole at the end)")
    add_progress_flags(p)
    return p


def _not_a_directory(directory):
    """The nearest existing ancestor of `directory` (itself included) when it is not a directory, else None."""
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def check_output(flag, path, inputs=()):
    """`check_output_file`, first saying when the output's directory cannot exist because a file stands where a
    directory of its path should be (`out.txt/m.hdf5`). Raises `UsageError`."""
    blocker = _not_a_directory(os.path.dirname(os.path.abspath(path)))
    if blocker is not None:
        raise UsageError(f"{flag}: cannot write {path!r}: {blocker!r} is not a directory")
    check_output_file(flag, path, inputs=inputs)


def _is_output(error, path):
    """Whether the OSError `error` is about the output `path`: that file, or its temporary beside it."""
    target = os.path.abspath(path)
    parent, name = os.path.split(target)
    for filename in (error.filename, getattr(error, "filename2", None)):
        if filename is None:
            continue
        filename = os.path.abspath(os.fsdecode(filename))
        if filename == target or (
            os.path.dirname(filename) == parent and os.path.basename(filename).startswith(f".{name}.tmp-")
        ):
            return True
    return False


def output_error(flag, path, error):
    """The one line of an OSError met while writing the output `path` (its temporary beside it): what stands in the
    way, as true as the error's number tells it."""
    parent = os.path.dirname(os.path.abspath(path))
    why = {
        errno.ENOENT: f"the directory {parent!r} does not exist (any more)",
        errno.ENOTDIR: f"{_not_a_directory(parent) or parent!r} is not a directory",
        errno.EACCES: f"the directory {parent!r} is not writable (permission denied)",
        errno.EPERM: f"the directory {parent!r} is not writable (operation not permitted)",
        errno.EROFS: f"the directory {parent!r} is on a read-only file system",
        errno.EISDIR: f"{path!r} is a directory",
    }.get(error.errno, error.strerror or str(error))
    return f"{flag}: cannot write {path!r}: {why}"


def main(argv=None, prog=PROG):
    """`merge-shards`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_parser(prog).parse_args(argv)
    if len(args.input) > 1:
        for path in args.input:
            if not os.path.isfile(path):
                raise UsageError(f"--input: no such file: {path!r}")
    elif not os.path.isfile(args.input[0]) and not glob.glob(glob.escape(args.input[0]) + "-*-of-*.hdf5"):
        raise UsageError(f"--input: no shard files {args.input[0]}-SSSSS-of-NNNNN.hdf5 and no such file")
    check_output("--output", args.output, inputs=[("--input", p) for p in args.input])
    from elmo_tf.cli import setup_logging
    from elmo_tf.errors import ElmoTFError
    from elmo_tf.io.embeddings_shards import merge_shards

    setup_logging(quiet=args.quiet)
    log = logging.getLogger("elmo_tf")
    shards = args.input[0] if len(args.input) == 1 and not os.path.isfile(args.input[0]) else args.input
    progress = Progress("merge-shards", quiet=args.quiet, interval=args.log_interval, log=log)
    try:
        count = merge_shards(
            shards, args.output, progress=progress.update, on_start=lambda total: progress.start(total, 0)
        )
    except OSError as e:  # the output's temporary cannot be made or renamed (a WriteError says so itself)
        if isinstance(e, ElmoTFError) or not _is_output(e, args.output):
            raise
        raise DataError(output_error("--output", args.output, e)) from None
    finally:
        progress.close()
    log.info("wrote %s (%d sentences)", args.output, count)
    return 0
