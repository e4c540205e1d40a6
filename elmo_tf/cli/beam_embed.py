"""`beam-embed`: `elmo-tf beam-embed ...` / `python -m elmo_tf.beam ...` (`elmo_tf.beam.pipeline`).

Flags are parsed and checked before Beam or TensorFlow is imported; the flags that are not ours go to Beam's
`PipelineOptions` (as Beam's wordcount example does with `parse_known_args`), which checks them before the run.
The flags shared with `embed` (model, input, packing, written datasets) are `elmo_tf.cli.embed.add_embed_flags`'s.
"""

import argparse
import contextlib
import logging
import os
import re
import sys
import time

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    check_output_dir,
    check_output_file,
    check_text_file,
    positive_int,
)
from elmo_tf.cli.embed import add_embed_flags, check_embed_flags, embed_settings, input_files

PROG = "elmo-tf beam-embed"
MAX_SHARDS = 99999  # the 5 digits of PREFIX-SSSSS-of-NNNNN

EXAMPLES = """examples:
  elmo-tf beam-embed --options options.json --weights weights.hdf5 --input sentences.txt --output out/emb \\
      --num-shards 4 --direct_num_workers 2 --direct_running_mode multi_processing
  elmo-tf merge-shards --input out/emb --output all.hdf5      # one file, as `elmo-tf embed` writes it

  elmo-tf beam-embed ... --precision auto     # a pipeline option: bfloat16 where the launching CPU has it

output: PREFIX-SSSSS-of-NNNNN.hdf5, each the `elmo-tf embed` output of a contiguous range of the input's lines:
datasets named by the line index in the whole input, sentence_to_index of its own lines (see `elmo-tf embed
--help` for the layout). Each shard's root attributes say the bound on a sentence (max_sentence_tokens,
long_sentences="split": a longer line is split as embed splits it), the precision, the run's fingerprint (run.model,
run.layers, run.dtype, run.precision, run.input, the settings) and its place (shard.index, shard.count), which
merge-shards checks. Paths may be local or of any Beam filesystem (gs://, s3://, hdfs://, ...).
Every other flag goes to Beam's PipelineOptions: --runner (DirectRunner by default), --direct_num_workers,
--direct_running_mode, --project, --region, --temp_location, --flink_master, --spark_master_url, ..., and elmo_tf's
own pipeline option (`elmo_tf.beam.options.ElmoTFOptions`):
  --precision {float32,bfloat16,auto}   what the workers' biLM computes in (float32); auto is decided once, on the
      machine that launches the pipeline: bfloat16 where it multiplies bfloat16 natively (AVX512_BF16, AMX), so
      every shard of a run has one precision
"""


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description="Write ELMo activations for every line of a text file as hdf5 shards, with an Apache Beam "
        "pipeline (the embed command's packing and model code on each worker).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # a prefix of ours must not swallow a Beam flag
    )
    add_embed_flags(p, "shard prefix: writes PREFIX-SSSSS-of-NNNNN.hdf5", remote_paths=True)
    p.add_argument(
        "--num-shards",
        type=positive_int("--num-shards", maximum=MAX_SHARDS),
        default=2,
        help="shards to write, the pipeline's parallelism (2)",
    )
    return p


def has_scheme(path):
    """True for `gs://...`, `s3://...`: a path that only Beam's FileSystems can check."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None and not path.startswith("file://")


def check_paths(args):
    """Usage errors of the local input paths (a remote one is checked through Beam, `check_remote`)."""
    for flag in ("--options", "--weights", "--input", "--token-embeddings", "--vocab"):
        path = getattr(args, flag[2:].replace("-", "_"))
        if path is None or has_scheme(path):
            continue
        if not os.path.isfile(path):
            what = "is a directory" if os.path.isdir(path) else "no such file"
            raise UsageError(f"{flag}: {what}: {path!r}")


def check_output_and_data(args):
    """The output prefix's directory (created when missing, as Beam's file sinks do), then the local options.json
    and input (data errors, exit 1)."""
    if not has_scheme(args.output):
        parent = os.path.dirname(os.path.abspath(args.output))
        check_output_dir("--output", parent)  # created when missing, as Beam's file sinks do
        os.makedirs(parent, exist_ok=True)
        shard = f"{args.output}-00000-of-{args.num_shards:05d}.hdf5"
        check_output_file("--output", shard, inputs=input_files(args))
    if not has_scheme(args.options):
        from elmo_tf.config import BiLMConfig, ConfigError

        try:
            BiLMConfig.from_json(args.options)
        except ConfigError as e:
            raise DataError(f"--options: {e}") from None
    for flag, path in (("--weights", args.weights), ("--token-embeddings", args.token_embeddings)):
        if path is not None and not has_scheme(path):  # the commonest bad file, found before the workers start
            import h5py

            if not h5py.is_hdf5(path):
                raise DataError(f"{flag}: {path}: not an HDF5 file (truncated, or another format)")
    if not has_scheme(args.input):
        check_text_file("--input", args.input)


def check_remote(args):
    """Usage errors of the paths of Beam filesystems (after Beam is imported)."""
    from apache_beam.io.filesystems import FileSystems

    for flag in ("--options", "--weights", "--input", "--token-embeddings", "--vocab"):
        path = getattr(args, flag[2:].replace("-", "_"))
        if path is not None and has_scheme(path):
            try:
                exists = FileSystems.exists(path)
            except Exception as e:  # an unknown scheme, a filesystem without its extra installed, no credentials
                raise UsageError(f"{flag}: cannot check {path!r}: {e}") from None
            if not exists:
                raise UsageError(f"{flag}: no such file: {path!r}")


def beam_parser():
    """The parser of every pipeline option Beam knows, as `PipelineOptions.get_all_options` builds it, elmo_tf's own
    (`ElmoTFOptions`) among them (apache_beam must be importable)."""
    from apache_beam.options import pipeline_options as po

    from elmo_tf.beam.options import ElmoTFOptions  # noqa: F401 (a PipelineOptions subclass: imported, it is known)

    parser = po._BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in po.PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser


def pipeline_options(beam_args):
    """Beam's `PipelineOptions` from the flags that are not ours; a flag Beam does not know, or a bad value, is a
    one-line usage error naming it (Beam itself would only log "Discarding unparseable args")."""
    import io

    try:
        from apache_beam.options import pipeline_options as po
    except ImportError as e:
        raise UsageError(f"Apache Beam is not installed ({e}): pip install 'elmo_tf[beam]'") from None

    parser = beam_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _known, unknown = parser.parse_known_args(beam_args)
            options = po.PipelineOptions(beam_args)
            options.get_all_options()
    except SystemExit:  # argparse: usage text + "prog: error: ..."
        lines = stderr.getvalue().strip().splitlines() or ["bad pipeline option"]
        raise UsageError(lines[-1].split("error: ", 1)[-1]) from None
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (neither ours nor Beam's pipeline options)")
    from apache_beam.runners.runner import create_runner

    standard = options.view_as(po.StandardOptions)
    standard.runner = standard.runner or "DirectRunner"
    try:
        create_runner(standard.runner)
    except (ValueError, ImportError) as e:
        raise UsageError(f"--runner: {e}") from None
    worker = options.view_as(po.WorkerOptions)
    if worker.default_sdk_harness_log_level is None and standard.runner in ("DirectRunner", "FnApiRunner"):
        # local worker processes write to our stderr: INFO per bundle, and each error once per retry; an error
        # comes back to the launcher anyway (one line below, or its traceback if it is not bad data)
        worker.default_sdk_harness_log_level = "CRITICAL"
    return options


LIBRARY_ERROR = re.compile(r"^elmo_tf\.[\w.]+Error: (.+?)(?: \[while running '[^']*'\])?$", re.MULTILINE)


def library_error(error):
    """The message of an `elmo_tf` error raised on a worker (Beam re-raises it as its own exception, the worker's
    traceback in the text), or None."""
    match = LIBRARY_ERROR.search(str(error))
    return match.group(1) if match else None


@contextlib.contextmanager
def quiet_beam_imports():
    """Beam logs which optional Google Cloud clients it misses while its IO modules are imported (some on the root
    logger); not our news."""
    root, beam_logger = logging.getLogger(), logging.getLogger("apache_beam")
    levels = root.level, beam_logger.level
    root.setLevel(logging.ERROR)
    beam_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(levels[0])
        beam_logger.setLevel(max(levels[1], logging.WARNING))  # and Beam's INFO lines (bundles, workers) stay out


def main(argv=None, prog=PROG):
    """`beam-embed`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    parser = build_parser(prog)
    args, beam_args = parser.parse_known_args(argv)
    check_embed_flags(args)
    check_paths(args)
    from elmo_tf.cli import setup_logging

    setup_logging()
    log = logging.getLogger("elmo_tf")
    with quiet_beam_imports():
        options = pipeline_options(beam_args)  # usage errors, before the data is looked at
        check_remote(args)
    check_output_and_data(args)
    with quiet_beam_imports():
        from elmo_tf.beam.pipeline import ShardedEmbedConfig, run

    from elmo_tf.beam.options import ElmoTFOptions
    from elmo_tf.cli.precision import precision_text, resolved_precision

    requested = options.view_as(ElmoTFOptions).precision
    config = ShardedEmbedConfig(
        precision=resolved_precision(requested),
        options=args.options,
        weights=args.weights,
        input=args.input,
        output=args.output,
        num_shards=args.num_shards,
        token_embeddings=args.token_embeddings,
        vocab=args.vocab,
        threads=args.threads,
        **embed_settings(args),
    )
    start = time.perf_counter()
    beam_logger = logging.getLogger("apache_beam")
    beam_logger.setLevel(logging.CRITICAL)  # a worker's error is logged once per retry; it is reported below
    try:
        paths = run(config, options)
    except Exception as e:
        message = library_error(e)
        if message is None:  # not bad data: a bug, or the runner's own failure; its traceback is kept
            raise
        raise DataError(message) from None
    finally:
        beam_logger.setLevel(logging.WARNING)
    log.info(
        "wrote %d shards %s in %.1f s, computed in %s",
        len(paths),
        f"{args.output}-*-of-{args.num_shards:05d}.hdf5",
        time.perf_counter() - start,
        precision_text(config.precision, requested),
    )
    return 0


if __name__ == "__main__":
    from elmo_tf.cli import run as run_cli

    sys.exit(run_cli(main))
