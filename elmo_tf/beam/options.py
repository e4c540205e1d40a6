"""The pipeline options of `elmo-tf beam-embed` that are Beam's kind: `ElmoTFOptions`, a `PipelineOptions` subclass.

As Beam's own options (`apache_beam.options.pipeline_options`: `StandardOptions`, `DirectOptions`, ...) and its
examples' (`WordcountOptions`) are declared: a subclass whose `_add_argparse_args` adds its flags, read back with
`options.view_as(ElmoTFOptions)`. It travels with the pipeline's options to every runner (a Dataflow template may set
it), and Beam's parser checks it with the others (`elmo_tf.cli.beam_embed.pipeline_options`: a bad value is argparse's
usage error naming the flag).

    --precision {float32,bfloat16,auto}: what the workers' biLM computes in (`elmo_tf.precision`); auto is decided
        once, on the machine that launches the pipeline, so every shard of a run has the same precision (merge-shards
        refuses shards of two).

Importing this module imports apache_beam (the `beam` extra).
"""

from apache_beam.options.pipeline_options import PipelineOptions

from elmo_tf.precision import PRECISIONS

PRECISION_HELP = (
    "what the workers' biLM computes in: float32 (the original numbers; the default), bfloat16 (the matmuls' "
    "operands in bfloat16, float32 accumulation, state and outputs), or auto (bfloat16 where the CPU that launches "
    "the pipeline multiplies bfloat16 natively: AVX512_BF16 or AMX; one precision for every shard)"
)


class ElmoTFOptions(PipelineOptions):
    """elmo_tf's pipeline options (see the module docstring)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--precision", choices=PRECISIONS, default="float32", help=PRECISION_HELP)


__all__ = ["ElmoTFOptions", "PRECISION_HELP"]
