"""`elmo-tf` (elmo_tf/cli/main.py): one command with a subcommand for every job. `--help`, `SUBCOMMAND --help` and
usage errors (an unknown flag, a missing file) answer without importing TensorFlow: exit 0 or 2, one error line
naming the subcommand, and `tensorflow` not in `sys.modules` afterwards. Each case runs `main` in a fresh process."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from cli_testlib import REPO_ROOT

from elmo_tf.cli.main import COMMANDS

SUBCOMMANDS = [
    "embed",
    "dump-token-embeddings",
    "build-vocab",
    "pretrain",
    "evaluate-lm",
    "score",
    "export",
    "export-tagger",
    "serve",
    "train-ner",
    "tune-ner",
    "tag",
    "beam-embed",
    "merge-shards",
    "models",
    "download",
    "convert",
]
MISSING = "/nonexistent/elmo_tf/missing.txt"

# each subcommand's required flags ({flag: value}; F: an existing file, D: an existing directory, OUT: a new path),
# and the flag whose file is then made missing, with what the error says
BASE = {
    "embed": {"--options": "F", "--weights": "F", "--input": "F", "--output": "OUT"},
    "dump-token-embeddings": {"--options": "F", "--weights": "F", "--vocab": "F", "--output": "OUT"},
    "build-vocab": {"--train": "F", "--output": "OUT"},
    "pretrain": {"--train": "F", "--vocab": "F", "--config": "small", "--output": "OUT", "--steps": "1"},
    "evaluate-lm": {"--model": "D", "--test": "F"},
    "score": {"--model": "D", "--input": "F", "--output": "OUT"},
    "export": {"--model-dir": "D", "--output": "OUT"},
    "export-tagger": {"--ner": "D", "--output": "OUT"},
    "serve": {"--model_base_path": "D", "--embedded": None},
    "train-ner": {"--train": "F", "--dev": "F", "--no-elmo": None, "--output": "OUT"},
    "tune-ner": {"--train": "F", "--dev": "F", "--no-elmo": None, "--output": "OUT", "--directory": "OUT"},
    "tag": {"--model": "D", "--input": "F"},
    "convert": {"--from": "bilm-tf-checkpoint", "DIR": "D", "--output": "OUT"},  # DIR: a positional
    "beam-embed": {"--options": "F", "--weights": "F", "--input": "F", "--output": "OUT"},
    "merge-shards": {"--input": "F", "--output": "OUT"},
    "models": {"--cache-dir": "D"},
    "download": {"NAME": "small", "--cache-dir": "D", "--quiet": None},
}
MISSING_FLAG = {
    "embed": ("--input", "no such file"),
    "dump-token-embeddings": ("--vocab", "no such file"),
    "build-vocab": ("--train", "no files match"),
    "pretrain": ("--train", "no files match"),
    "evaluate-lm": ("--test", "no such file"),
    "score": ("--input", "no such file"),
    "export": ("--model-dir", MISSING),
    "export-tagger": ("--ner", "not a directory"),
    "serve": ("--model_base_path", "not a directory"),
    "train-ner": ("--train", "no such file"),
    "tune-ner": ("--dev", "no such file"),
    "tag": ("--input", "no such file"),
    "convert": ("DIR", "not a directory"),
    "beam-embed": ("--input", "no such file"),
    "merge-shards": ("--input", "no shard files"),
    "models": ("--cache-dir", "expected one argument"),  # reads no file: its usage error is a flag without its value
    "download": ("NAME", "not a local directory, a URL or a released model name"),
}

# runs main(argv) for each case of a JSON list; prints, per case, the exit status, stdout, stderr and whether
# TensorFlow (or Keras) was imported by then
CHILD = """
import contextlib, io, json, sys
from elmo_tf.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv, prog="elmo-tf")
        except SystemExit as e:
            code = e.code
    results.append([code, out.getvalue(), err.getvalue(), sorted({"tensorflow", "keras"} & set(sys.modules))])
print(json.dumps(results))
"""


def child_env():
    """This environment with this checkout first on the path of a child process."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}


def run_cases(cases):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True, env=child_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def argv_of(command, paths, **override):
    argv = [command]
    for flag, value in {**BASE[command], **override}.items():
        if flag.startswith("-"):  # else a positional, named by its metavar
            argv.append(flag)
        if value is not None:
            argv.append(str(paths.get(value, value)))
    return argv


@pytest.fixture
def paths(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("a b c\n")
    (tmp_path / "dir").mkdir()
    return {"F": f, "D": tmp_path / "dir", "OUT": tmp_path / "new" / "out"}


def test_help_lists_every_subcommand():
    assert list(COMMANDS) == SUBCOMMANDS
    [(code, out, err, loaded)] = run_cases([["--help"]])
    assert code == 0 and err == "" and loaded == []
    assert out.startswith("usage: elmo-tf [-h] command ...")
    section = out.split("positional arguments:")[1].split("options:")[0]
    listed = [line.split()[0] for line in section.splitlines() if line.startswith("    ") and line[4] != " "]
    assert listed == SUBCOMMANDS


def test_no_command_and_an_unknown_command_are_one_line():
    (code, out, err, loaded), (code2, out2, err2, loaded2) = run_cases([[], ["embedd", "--input", "x"]])
    assert code == 2 and err == "elmo-tf: error: the following arguments are required: command\n" and loaded == []
    assert code2 == 2 and err2.count("\n") == 1 and loaded2 == []
    assert err2.startswith("elmo-tf: error: argument command: invalid choice: 'embedd' (choose from 'embed', ")


def test_every_subcommand_answers_help_and_usage_errors_without_tensorflow(paths):
    """Per subcommand: --help (exit 0, its own usage line, no stderr), an unknown flag and a missing file (exit 2,
    one line `elmo-tf SUBCOMMAND: error: ...` naming the flag), with the other flags valid; TensorFlow never loaded."""
    cases = []
    for command in SUBCOMMANDS:
        flag, _needle = MISSING_FLAG[command]
        cases += [
            [command, "--help"],
            [*argv_of(command, paths), "--bogus-flag"],
            argv_of(command, paths, **{flag: MISSING}) if command != "models" else [command, flag],
        ]
    results = run_cases(cases)
    for command, (helped, unknown, missing) in zip(SUBCOMMANDS, zip(*[iter(results)] * 3)):
        code, out, err, loaded = helped
        assert (code, err, loaded) == (0, "", []), (command, helped)
        assert out.startswith(f"usage: elmo-tf {command} "), (command, out[:80])
        code, out, err, loaded = unknown
        assert code == 2 and out == "" and loaded == [], (command, unknown)
        assert err.startswith(f"elmo-tf {command}: error: unrecognized arguments: --bogus-flag"), (command, err)
        assert err.count("\n") == 1, (command, err)
        code, out, err, loaded = missing
        flag, needle = MISSING_FLAG[command]
        assert code == 2 and out == "" and loaded == [], (command, missing)
        assert err.startswith(f"elmo-tf {command}: error: ") and err.count("\n") == 1, (command, err)
        assert flag in err and needle in err, (command, err)
    assert not paths["OUT"].parent.exists()


def test_embed_epilog_has_no_runs_of_spaces():
    """The examples of `embed --help` continue their lines with a backslash, not with runs of spaces."""
    [(code, out, _err, _loaded)] = run_cases([["embed", "--help"]])
    assert code == 0
    examples = out.split("examples:\n")[1].split("\n\n")[1]  # the dump-token-embeddings / --token-embeddings pair
    assert re.search(r"\S {2,}--", examples) is None, examples  # was "vocab.txt       --output tokens.hdf5"
    assert examples.count("\\\n      --") == 2, examples


@pytest.mark.parametrize("argv", [["--help"], ["embed", "--bad"]], ids=["help", "embed-bad"])
def test_python_m_elmo_tf_answers_fast_without_tensorflow_lines(argv):
    """`python -m elmo_tf` itself (interpreter start-up included): under 2 s here on a shared machine (about 0.1 s
    alone; TensorFlow's import alone takes 3-5 s), and no TensorFlow start-up lines."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "elmo_tf", *argv], capture_output=True, text=True, env=env, timeout=60, cwd=REPO_ROOT
    )
    seconds = time.perf_counter() - start
    if argv == ["--help"]:
        assert result.returncode == 0 and result.stderr == ""
        assert result.stdout.startswith("usage: python -m elmo_tf [-h] command ...")
    else:
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("python -m elmo_tf embed: error: ") and result.stderr.count("\n") == 1
    assert seconds < 2.0, seconds


CLI_MODULES = sorted(
    "elmo_tf.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
    for path in (REPO_ROOT / "elmo_tf" / "cli").glob("*.py")
)


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_cli_module_imports_without_tensorflow(module):
    """Importing a command's module, in a fresh process, loads neither TensorFlow nor Keras, nor NumPy, h5py or gRPC
    (NumPy alone took 0.4 s of a 0.8 s `pretrain --help` on this busy machine): the constants and types its parser takes
    (`TOKENIZERS`, `SPECIALS`, `expand_glob`, `TrainConfig`'s fields and bounds) come from the library's own light
    modules, not from copies (there was `elmo_tf.cli.mirrors`)."""
    heavy = {"tensorflow", "keras", "numpy", "h5py", "grpc"}
    code = f"import sys, {module}\nprint(sorted({heavy!r} & {{m.split('.')[0] for m in sys.modules}}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n", (module, result.stdout)


def test_the_scripts_are_thin():
    """training/*.py and export/*.py only call `run(main, prog=PROG)` of their elmo_tf.cli module."""
    for path in [*(REPO_ROOT / "training").glob("*.py"), *(REPO_ROOT / "export").glob("*.py")]:
        text = path.read_text()
        assert "ArgumentParser" not in text and "add_argument" not in text, path
        assert "sys.exit(run(main, prog=PROG))" in text and len(text.splitlines()) <= 20, path


PRECISION_COMMANDS = ["embed", "beam-embed", "score", "train-ner", "tag", "export", "export-tagger", "pretrain"]


def test_every_precision_flag_refuses_a_bad_value_with_argparse_s_line(paths):
    """`--precision` (issue 51) on every command that runs a biLM (beam-embed's is a Beam pipeline option, parsed by
    Beam's parser): a value that is not float32, bfloat16 or auto is argparse's one usage line naming the flag and the
    choices (exit 2), before TensorFlow loads."""
    results = run_cases([[*argv_of(command, paths), "--precision", "fp16"] for command in PRECISION_COMMANDS])
    for command, (code, out, err, loaded) in zip(PRECISION_COMMANDS, results):
        assert code == 2 and out == "" and "tensorflow" not in loaded, (command, code, err, loaded)
        assert err.startswith(f"elmo-tf {command}: error: argument --precision: invalid choice: 'fp16'"), (command, err)
        assert "'float32', 'bfloat16', 'auto'" in err and err.count("\n") == 1, (command, err)
    assert not paths["OUT"].parent.exists()
