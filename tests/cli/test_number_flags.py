"""Every number flag of every command line (`python -m elmo_tf embed / dump-token-embeddings`, training/*.py) has its
range checked by argparse, before anything is read or built: exit 2, one line on stderr naming the flag and the value,
no traceback. Sizes stop at int32 (or tf.data's buffer ceiling), counts at int64, seeds at numpy's 2**32, floats are
finite. In process through each script's `main` (the table), and a few as real commands in subprocesses."""

import dataclasses
import importlib
from pathlib import Path

import pytest
from cli_testlib import REPO_ROOT, assert_one_error, run_command

SCRIPTS = {
    "embed": REPO_ROOT / "elmo_tf" / "__main__.py",
    "dump-token-embeddings": REPO_ROOT / "elmo_tf" / "__main__.py",
    "pretrain": REPO_ROOT / "training" / "pretrain.py",
    "train_ner": REPO_ROOT / "training" / "train_ner.py",
    "tune_ner": REPO_ROOT / "training" / "tune_ner.py",
    "build_vocab": REPO_ROOT / "training" / "build_vocab.py",
    "evaluate_lm": REPO_ROOT / "training" / "evaluate_lm.py",
    "tag": REPO_ROOT / "training" / "tag.py",
}
# the parser of each command, in elmo_tf.cli
PARSERS = {
    "embed": "elmo_tf.cli.embed:build_parser",
    "dump-token-embeddings": "elmo_tf.cli.embed:build_dump_parser",
    "pretrain": "elmo_tf.cli.pretrain:build_parser",
    "train_ner": "elmo_tf.cli.train_ner:build_parser",
    "tune_ner": "elmo_tf.cli.tune_ner:build_parser",
    "build_vocab": "elmo_tf.cli.build_vocab:build_parser",
    "evaluate_lm": "elmo_tf.cli.evaluate_lm:build_parser",
    "tag": "elmo_tf.cli.tag:build_parser",
}


def build_parser(command):
    module, function = PARSERS[command].split(":")
    return getattr(importlib.import_module(module), function)()


BIG = str(10**12)
INT32_OVER, INT64_OVER, SEED_OVER = str(2**31), str(2**63), str(2**32)

# (command, flag, bad value): below the range, over it, not finite
CASES = [
    ("embed", "--batch-size", "0"),
    ("embed", "--batch-size", BIG),
    ("embed", "--max-batch-tokens", "0"),
    ("embed", "--max-batch-tokens", INT32_OVER),
    ("embed", "--max-sentence-tokens", "-1"),
    ("embed", "--max-sentence-tokens", INT32_OVER),
    ("embed", "--threads", "-1"),
    ("embed", "--threads", "100000"),
    ("embed", "--shard-tokens", "0"),
    ("embed", "--shard-tokens", INT32_OVER),
    ("embed", "--log-interval", "0"),
    ("embed", "--log-interval", "inf"),
    ("dump-token-embeddings", "--batch-size", "0"),
    ("dump-token-embeddings", "--batch-size", BIG),
    ("pretrain", "--cpu-replicas", "0"),
    ("pretrain", "--cpu-replicas", "100000"),
    ("pretrain", "--steps", "0"),
    ("pretrain", "--steps", INT64_OVER),
    ("pretrain", "--epochs", "0"),
    ("pretrain", "--epochs", "inf"),
    ("pretrain", "--epochs", "nan"),
    ("pretrain", "--max-minutes", "0"),
    ("pretrain", "--max-minutes", "inf"),
    ("pretrain", "--batch-size", "0"),
    ("pretrain", "--batch-size", BIG),
    ("pretrain", "--batch-size", str(2**24 + 1)),  # tf.data's group_by_window reserves a slot per sentence
    ("pretrain", "--max-tokens", "0"),
    ("pretrain", "--max-tokens", INT32_OVER),
    ("pretrain", "--learning-rate", "0"),
    ("pretrain", "--learning-rate", "-0.1"),
    ("pretrain", "--learning-rate", "inf"),
    ("pretrain", "--learning-rate", "nan"),
    ("pretrain", "--clip-norm", "-1"),
    ("pretrain", "--clip-norm", "inf"),
    ("pretrain", "--dropout", "-0.1"),
    ("pretrain", "--dropout", "1"),
    ("pretrain", "--dropout", "nan"),
    ("pretrain", "--num-sampled", "0"),
    ("pretrain", "--num-sampled", INT32_OVER),
    ("pretrain", "--checkpoint-every", "0"),
    ("pretrain", "--checkpoint-every", INT64_OVER),
    ("pretrain", "--log-every", "0"),
    ("pretrain", "--log-every", INT64_OVER),
    ("pretrain", "--validate-every", "-1"),
    ("pretrain", "--validate-every", INT64_OVER),
    ("pretrain", "--shuffle-buffer", "-1"),
    ("pretrain", "--shuffle-buffer", str(2**24 + 1)),  # tf.data allocates the whole buffer up front
    ("pretrain", "--bucket-width", "0"),
    ("pretrain", "--bucket-width", INT32_OVER),
    ("pretrain", "--seed", "-1"),
    ("pretrain", "--seed", SEED_OVER),
    ("pretrain", "--threads", "-1"),
    ("pretrain", "--threads", "100000"),
    ("train_ner", "--max-sentences", "-1"),
    ("train_ner", "--max-sentences", INT64_OVER),
    ("train_ner", "--epochs", "0"),
    ("train_ner", "--epochs", INT64_OVER),
    ("train_ner", "--patience", "0"),
    ("train_ner", "--patience", INT64_OVER),
    ("train_ner", "--batch-size", "0"),
    ("train_ner", "--batch-size", BIG),
    ("train_ner", "--learning-rate", "0"),
    ("train_ner", "--learning-rate", "inf"),
    ("train_ner", "--learning-rate", "nan"),
    ("train_ner", "--lstm-units", "0"),
    ("train_ner", "--lstm-units", INT32_OVER),
    ("train_ner", "--server-max-tokens", "0"),
    ("train_ner", "--server-max-tokens", INT32_OVER),
    ("train_ner", "--dropout", "-0.5"),
    ("train_ner", "--dropout", "1"),
    ("train_ner", "--gamma", "0"),
    ("train_ner", "--gamma", "inf"),
    ("train_ner", "--mix-l2", "-1"),
    ("train_ner", "--mix-l2", "inf"),
    ("train_ner", "--seed", "-1"),
    ("train_ner", "--seed", SEED_OVER),
    ("tune_ner", "--seed", "0"),  # KerasTuner's "pick a random seed"
    ("tune_ner", "--seed", SEED_OVER),
    ("tune_ner", "--max-trials", "0"),
    ("tune_ner", "--max-trials", INT64_OVER),
    ("tune_ner", "--trial-epochs", "0"),
    ("tune_ner", "--trial-epochs", INT64_OVER),
    ("tune_ner", "--max-sentences", "-1"),
    ("tune_ner", "--epochs", INT64_OVER),
    ("tune_ner", "--patience", "0"),
    ("tune_ner", "--batch-size", BIG),
    ("tune_ner", "--learning-rate", "inf"),
    ("tune_ner", "--lstm-units", INT32_OVER),
    ("tune_ner", "--server-max-tokens", "0"),
    ("tune_ner", "--server-max-tokens", INT32_OVER),
    ("build_vocab", "--min-count", "0"),
    ("build_vocab", "--min-count", INT64_OVER),
    ("build_vocab", "--max-size", "3"),
    ("build_vocab", "--max-size", INT32_OVER),
    ("evaluate_lm", "--batch-size", "0"),
    ("evaluate_lm", "--batch-size", BIG),
    ("evaluate_lm", "--max-tokens", "0"),
    ("evaluate_lm", "--max-tokens", INT32_OVER),
    ("tag", "--batch-size", "0"),
    ("tag", "--batch-size", BIG),
    ("tag", "--server-max-tokens", "0"),
    ("tag", "--server-max-tokens", INT32_OVER),
]


@pytest.fixture
def paths(tmp_path):
    """Files and directories that exist, for the path flags (argparse only checks that they exist; nothing is read
    before the bad number stops the command)."""
    d = tmp_path
    (d / "file.txt").write_text("the cat\n")
    (d / "model").mkdir()
    return {"FILE": d / "file.txt", "DIR": d / "model", "OUT": d / "out" / "x", "NEW": d / "new.hdf5"}


def base_argv(command, paths):
    """A command line that is valid but for the flag under test (which goes first: argparse stops at it)."""
    f, out = paths["FILE"], paths["OUT"]
    return {
        "embed": ["--options", f, "--weights", f, "--input", f, "--output", paths["NEW"]],
        "dump-token-embeddings": ["--options", f, "--weights", f, "--vocab", f, "--output", paths["NEW"]],
        "pretrain": ["--train", f, "--vocab", f, "--config", "small", "--output", out],
        "train_ner": ["--train", f, "--dev", f, "--no-elmo", "--output", out],
        "tune_ner": ["--train", f, "--dev", f, "--no-elmo", "--output", out, "--directory", out],
        "build_vocab": ["--train", f, "--output", paths["NEW"]],
        "evaluate_lm": ["--model", paths["DIR"], "--test", f],
        "tag": ["--model", paths["DIR"]],
    }[command]


def command_argv(command, paths, *flag_value):
    """`flag_value` first (pretrain's --steps/--epochs are exclusive: the base adds --steps only when neither
    is given), then the base; the subcommand name first for `python -m elmo_tf`."""
    argv = [*flag_value, *base_argv(command, paths)]
    if command == "pretrain" and not {"--steps", "--epochs"} & set(flag_value):
        argv += ["--steps", "1"]
    if SCRIPTS[command].name == "__main__.py":
        argv = [command, *argv]
    return [str(a) for a in argv]


@pytest.mark.parametrize("command, flag, value", CASES, ids=[f"{c}{f}={v}" for c, f, v in CASES])
def test_a_bad_number_is_one_usage_line_naming_flag_and_value(paths, run_script, command, flag, value):
    code, out, err = run_script(SCRIPTS[command], command_argv(command, paths, flag, value))
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "error: argument " + flag in err and f"{flag} must be" in err and repr(value) in err, err
    assert not paths["NEW"].exists() and not paths["OUT"].parent.exists()


def number_actions(command):
    """{flag: argparse action} of every option of `command` that parses a number."""
    parser = build_parser(command)
    found = {}
    for action in parser._actions:
        assert action.type not in (int, float), f"{command} {action.option_strings}: a bare {action.type.__name__}"
        if hasattr(action.type, "bounds"):
            found[action.option_strings[0]] = action
    return found


@pytest.mark.parametrize("command", list(SCRIPTS))
def test_every_number_flag_is_bounded_and_in_the_table(paths, command):
    """No flag parses a bare int or float; every number flag has a finite ceiling (ints) and is in CASES both below
    its range and over it; the ceiling itself is accepted."""
    actions = number_actions(command)
    assert actions, command
    tried = {(f, v) for c, f, v in CASES if c == command}
    for flag, action in actions.items():
        bounds = action.type.bounds
        assert bounds.low is not None, (command, flag)
        if bounds.kind is int:
            assert bounds.high is not None and bounds.high < 2**63, (command, flag)
        values = [v for f, v in tried if f == flag]
        assert values, f"{command} {flag} is missing from CASES"
        if not (command == "tune_ner" and flag not in ("--seed", "--max-trials", "--trial-epochs")):
            # two cases at least (the flags tune_ner shares with train_ner are tried both ways there)
            assert len(values) >= 2, (command, flag, values)
        if bounds.high is not None and not bounds.open_high:
            argv = command_argv(command, paths, flag, str(bounds.high))
            parser = build_parser(command)
            argv = argv[1:] if SCRIPTS[command].name == "__main__.py" else argv  # without the subcommand
            assert getattr(parser.parse_args(argv), action.dest) == bounds.high


# a few as real commands: the process's own stderr and exit status
@pytest.mark.parametrize(
    "command, flag, value, needle",
    [
        ("pretrain", "--shuffle-buffer", "-1", "--shuffle-buffer must be >= 0, got '-1'"),
        ("pretrain", "--seed", "-1", "--seed must be >= 0, got '-1'"),
        ("train_ner", "--seed", "-1", "--seed must be >= 0, got '-1'"),
        ("tune_ner", "--seed", SEED_OVER, f"--seed must be <= {2**32 - 1} (numpy's seeds are 0 <= seed < 2**32)"),
        ("embed", "--batch-size", BIG, f"--batch-size must be <= {2**31 - 1} (int32), got '{BIG}'"),
        ("pretrain", "--batch-size", BIG, f"--batch-size must be <= {2**24}"),
    ],
    ids=["pretrain-shuffle", "pretrain-seed", "train_ner-seed", "tune_ner-seed", "embed-batch", "pretrain-batch"],
)
@pytest.mark.slow
def test_bad_numbers_as_real_commands(paths, command, flag, value, needle):
    script = SCRIPTS[command]
    argv = command_argv(command, paths, flag, value)
    args = ["-m", "elmo_tf", *argv] if script.name == "__main__.py" else [script, *argv]
    line = assert_one_error(run_command(args, timeout=120), 2, f"error: argument {flag}", needle)
    assert "--directory" not in line  # tune_ner.py blamed --directory for KerasTuner's refusal of the seed
    assert not paths["OUT"].parent.exists() and not Path(paths["NEW"]).exists()


def test_train_config_fields_are_pretrain_flags_with_the_same_ranges():
    """Each TrainConfig field names a flag of training/pretrain.py (the mapping the CLI uses to name the flag of a
    ConfigError); a number field's flag is checked with the dataclass's own Bounds (--steps and --epochs, one of
    which must be given, start above 0)."""
    from elmo_tf.pretraining import TrainConfig

    parser = build_parser("pretrain")
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for field in dataclasses.fields(TrainConfig):
        flag, bounds = field.metadata["flag"], field.metadata["bounds"]
        assert flag in actions, (field.name, flag)
        if flag in ("--steps", "--epochs"):
            cli = actions[flag].type.bounds
            assert (cli.low, cli.open_low, cli.high) == (bounds.low, flag == "--epochs", bounds.high) or (
                flag == "--steps" and (cli.low, cli.high) == (1, bounds.high)
            )
        elif bounds is not None:
            assert actions[flag].type.bounds is bounds, field.name  # the field's own object, not a copy
        else:
            assert actions[flag].choices, field.name  # --optimizer, --matmul-precision
