"""`--precision {float32,bfloat16,auto}`: the flag every command that runs a biLM shares (`elmo_tf.precision`).

    float32   the original numbers, exactly (the default)
    bfloat16  the matmuls' operands in bfloat16, float32 accumulation, state and outputs
    auto      bfloat16 where the CPU multiplies bfloat16 natively (AVX512_BF16 or AMX), float32 elsewhere

A bad value is argparse's usage error naming the flag (exit 2). `auto` is decided once per process
(`elmo_tf.precision.resolve_precision`, which logs its decision and why), and the value a command computes in is said
in the command's own log line (`precision_text`: its summary, never a line of its own that would stand before an error
line). Imports neither TensorFlow nor NumPy: `--help` and usage errors answer at once.
"""

from elmo_tf.precision import COMPUTED, PRECISIONS

PRECISION_HELP = (
    "float32 (the original numbers), bfloat16 (the matmuls' operands in bfloat16, float32 accumulation, state and "
    "outputs: faster on CPUs with AVX512_BF16 or AMX, emulated and slower elsewhere), or auto (bfloat16 where this "
    "CPU multiplies it natively, else float32)"
)


def add_precision_flag(parser, default="float32", what=""):
    """Adds `--precision` (choices `PRECISIONS`) to `parser`; `what` ends its help (what the precision applies to),
    `default` is its default (None: the command decides, and says so in `what`)."""
    shown = f" ({default})" if default else ""
    return parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=default,
        help=f"{PRECISION_HELP}{shown}{what}",
    )


def resolved_precision(requested, flag="--precision"):
    """The precision to compute in ("float32" or "bfloat16") for `requested` (one of `PRECISIONS`; None: float32),
    `auto` decided once per process (`elmo_tf.precision.resolve_precision` logs the decision)."""
    from elmo_tf.precision import resolve_precision

    return resolve_precision(requested, name=flag)


def precision_text(resolved, requested, flag="--precision"):
    """How a command's log line says its precision: "bfloat16", or "float32 (--precision auto)" when the value asked
    for was not the one computed in."""
    if requested in (None, resolved):
        return resolved
    return f"{resolved} ({flag} {requested})"


__all__ = ["COMPUTED", "PRECISIONS", "PRECISION_HELP", "add_precision_flag", "precision_text", "resolved_precision"]
