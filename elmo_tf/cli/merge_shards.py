"""`merge-shards`: `elmo-tf merge-shards --input PREFIX --output out.hdf5` (`elmo_tf.io.embeddings_shards`).

Shards that are not one run's complete set (a shard missing, line indices in two shards or in none) are refused
with one line naming the file and the index (exit 1), before anything is written.
"""

import argparse
import glob
import logging
import os

from elmo_tf.cli import ArgumentParser, UsageError, check_output_file
from elmo_tf.cli.progress import Progress, add_progress_flags

PROG = "elmo-tf merge-shards"

EXAMPLES = """examples:
  elmo-tf merge-shards --input out/emb --output all.hdf5          # out/emb-SSSSS-of-NNNNN.hdf5
  elmo-tf merge-shards --input a-00000-of-00002.hdf5 a-00001-of-00002.hdf5 --output all.hdf5

output: the `elmo-tf embed` output of the whole input: every shard's datasets (copied as stored) and one
sentence_to_index (a key of several lines maps to the last, as embed writes it).
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


def main(argv=None, prog=PROG):
    """`merge-shards`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_parser(prog).parse_args(argv)
    if len(args.input) > 1:
        for path in args.input:
            if not os.path.isfile(path):
                raise UsageError(f"--input: no such file: {path!r}")
    elif not os.path.isfile(args.input[0]) and not glob.glob(glob.escape(args.input[0]) + "-*-of-*.hdf5"):
        raise UsageError(f"--input: no shard files {args.input[0]}-SSSSS-of-NNNNN.hdf5 and no such file")
    check_output_file("--output", args.output, inputs=[("--input", p) for p in args.input])
    from elmo_tf.cli import setup_logging
    from elmo_tf.io.embeddings_shards import merge_shards

    setup_logging(quiet=args.quiet)
    log = logging.getLogger("elmo_tf")
    shards = args.input[0] if len(args.input) == 1 and not os.path.isfile(args.input[0]) else args.input
    progress = Progress("merge-shards", quiet=args.quiet, interval=args.log_interval, log=log)
    try:
        count = merge_shards(
            shards, args.output, progress=progress.update, on_start=lambda total: progress.start(total, 0)
        )
    finally:
        progress.close()
    log.info("wrote %s (%d sentences)", args.output, count)
    return 0
