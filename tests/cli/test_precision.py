"""elmo_tf/cli/precision.py: the `--precision` flag the commands share (issue 51): its choices and argparse's usage
error naming it, `auto` resolved by the CPU (float32 on this AVX2 CPU, bfloat16 where AVX512_BF16 is), and how a
command's log line says the precision."""

import argparse

import pytest

from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision
from elmo_tf.precision import PrecisionError, native_bfloat16


def test_the_flag_takes_the_three_values_and_refuses_others_naming_itself(capsys):
    parser = argparse.ArgumentParser(prog="cmd")
    add_precision_flag(parser, what=": of the test")
    assert [parser.parse_args(["--precision", p]).precision for p in ("float32", "bfloat16", "auto")] == [
        "float32",
        "bfloat16",
        "auto",
    ]
    assert parser.parse_args([]).precision == "float32"
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision", "float16"])
    err = capsys.readouterr().err.splitlines()[-1]
    choices = "(choose from 'float32', 'bfloat16', 'auto')"
    assert err == f"cmd: error: argument --precision: invalid choice: 'float16' {choices}"


def test_auto_is_decided_by_the_cpu_and_a_bad_value_names_the_flag():
    assert resolved_precision("auto") == ("bfloat16" if native_bfloat16() else "float32")
    assert resolved_precision(None) == "float32" and resolved_precision("bfloat16") == "bfloat16"
    with pytest.raises(PrecisionError, match=r"--matmul-precision must be one of float32, bfloat16, auto; got 'x'"):
        resolved_precision("x", flag="--matmul-precision")


@pytest.mark.parametrize(
    "resolved, requested, text",
    [
        ("float32", None, "float32"),
        ("bfloat16", "bfloat16", "bfloat16"),
        ("float32", "auto", "float32 (--precision auto)"),
        ("bfloat16", "auto", "bfloat16 (--precision auto)"),
    ],
)
def test_the_log_line_says_the_precision_computed_in_and_auto_when_asked(resolved, requested, text):
    assert precision_text(resolved, requested) == text
