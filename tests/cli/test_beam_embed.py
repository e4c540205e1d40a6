"""elmo_tf/cli/beam_embed.py: `elmo-tf beam-embed` / `python -m elmo_tf.beam` errors are one line (exit 2 for a bad
flag or a missing file, 1 for bad data), checked before the pipeline runs; --help loads no Beam nor TensorFlow."""

import h5py
import pytest
from cli_testlib import assert_one_error, run_command
from tiny_models import TINY

from elmo_tf.config import BiLMConfig


@pytest.fixture
def files(tmp_path):
    BiLMConfig(**TINY).to_json(tmp_path / "options.json")
    h5py.File(tmp_path / "weights.hdf5", "w").close()  # an HDF5 file (its content is checked by the workers)
    (tmp_path / "in.txt").write_text("a b\n\nc\n")
    return tmp_path


def beam_embed(files, *extra, input_name="in.txt", options="options.json"):
    return run_command(
        ["-m", "elmo_tf.beam", "--options", files / options, "--weights", files / "weights.hdf5"]
        + ["--input", files / input_name, "--output", files / "emb", *extra]
    )


def test_help_loads_neither_beam_nor_tensorflow():
    code = (
        "import sys\nfrom elmo_tf.cli.main import main\n"
        "try:\n    main(['beam-embed', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'apache_beam', 'tensorflow', 'keras'}))"
    )
    result = run_command(["-c", code], fresh=True)
    assert result.returncode == 0, result.stderr
    assert "--num-shards" in result.stdout and result.stdout.splitlines()[-1] == "[]"


def test_missing_input(files):
    assert_one_error(beam_embed(files, input_name="nope.txt"), 2, "--input: no such file", "nope.txt")


def test_bad_options_file(files):
    (files / "bad.json").write_text('{"lstm": {"dim": 4}}')
    assert_one_error(beam_embed(files, options="bad.json"), 1, "--options", "bad.json")


def test_a_weight_file_that_is_not_hdf5(files):
    (files / "weights.hdf5").write_bytes(b"not hdf5")
    assert_one_error(beam_embed(files), 1, "--weights", "weights.hdf5: not an HDF5 file")


def test_a_bad_line_in_the_input(files):
    (files / "bad.txt").write_bytes(b"ok\nnul \x00 here\n")
    assert_one_error(beam_embed(files, input_name="bad.txt"), 1, "--input", "bad.txt:2: NUL byte")


@pytest.mark.parametrize(
    "flags,needles",
    [
        (["--batch-size", "0"], ["--batch-size", "'0'"]),
        (["--num-shards", "100000"], ["--num-shards", "'100000'"]),
        (["--direct_num_workers", "two"], ["--direct_num_workers", "'two'"]),
        (["--no-such-flag", "1"], ["--no-such-flag"]),
        (["--runner", "NoSuchRunner"], ["--runner", "NoSuchRunner"]),
        (["--precision", "fp16"], ["argument --precision: invalid choice: 'fp16'", "'bfloat16'"]),
    ],
    ids=["batch-size", "num-shards", "beam-value", "unknown-flag", "runner", "precision"],
)
def test_bad_flags(files, flags, needles):
    assert_one_error(beam_embed(files, *flags), 2, *needles)


def test_output_under_a_file(files):
    result = run_command(
        ["-m", "elmo_tf.beam", "--options", files / "options.json", "--weights", files / "weights.hdf5"]
        + ["--input", files / "in.txt", "--output", files / "in.txt" / "dir" / "emb"]
    )
    assert_one_error(result, 2, "--output", "in.txt")


@pytest.mark.parametrize("flag", ["--input", "--weights", "--token-embeddings", "--vocab"])
def test_an_output_shard_that_is_one_of_the_inputs(files, flag):
    """The first shard's name is any file the pipeline reads (as embed refuses for its --output): exit 2, nothing
    written, the file untouched."""
    shard = files / "emb-00000-of-00001.hdf5"
    h5py.File(files / "tokens.hdf5", "w").close()
    (files / "vocab.txt").write_text("a\nb\n")
    paths = {
        "--input": "in.txt",
        "--weights": "weights.hdf5",
        "--token-embeddings": "tokens.hdf5",
        "--vocab": "vocab.txt",
    }
    (files / paths[flag]).rename(shard)
    paths[flag] = shard.name
    before = shard.read_bytes()
    result = run_command(
        ["-m", "elmo_tf.beam", "--options", files / "options.json", "--num-shards", "1", "--output", files / "emb"]
        + [arg for name, path in paths.items() for arg in (name, files / path)]
    )
    assert_one_error(result, 2, "--output", "is the same file as " + flag, "would be destroyed")
    assert shard.read_bytes() == before


def test_the_flags_it_shares_with_embed_are_embeds():
    """Every flag of embed but its resume and progress flags is a flag of beam-embed with the same default, choices,
    bounds and help (a path's help adding that it may be of a Beam filesystem; --output is a file there, a shard
    prefix here); beam-embed adds only --num-shards. embed's --options and --weights may be replaced by its --model (a
    released model's name, fetched into the local cache, which Beam's remote workers could not read). embed's
    --precision is a pipeline option of beam-embed (`ElmoTFOptions`, Beam's parser), with the same choices and
    default."""
    import argparse

    from elmo_tf.beam.options import ElmoTFOptions
    from elmo_tf.cli import beam_embed, embed

    def flags(parser):
        return {a.option_strings[-1]: a for a in parser._actions if a.option_strings and a.dest != "help"}

    embeds, beams = flags(embed.build_parser()), flags(beam_embed.build_parser())
    pipeline = argparse.ArgumentParser()
    ElmoTFOptions._add_argparse_args(pipeline)
    option = flags(pipeline)["--precision"]
    assert (option.default, option.choices) == (embeds["--precision"].default, embeds["--precision"].choices)
    only_embed = {"--resume", "--shard-tokens", "--quiet", "--log-interval", "--model", "--precision"}
    assert set(beams) - set(embeds) == {"--num-shards"}
    assert set(embeds) - set(beams) == only_embed
    paths = {"--options", "--weights", "--input", "--token-embeddings", "--vocab"}
    for name in set(embeds) - only_embed:
        a, b = embeds[name], beams[name]
        or_model = name in ("--options", "--weights")
        assert (a.default, a.choices, a.nargs) == (b.default, b.choices, b.nargs), name
        assert a.required == (b.required and not or_model), name
        assert getattr(a.type, "bounds", None) == getattr(b.type, "bounds", None), name
        if name != "--output":
            embed_help = a.help.removesuffix(" (or --model)") if or_model else a.help
            assert b.help == embed_help + (" (local or a Beam filesystem)" if name in paths else ""), name
