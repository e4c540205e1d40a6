"""The code blocks of README.md and docs/, and the checks of their shell commands.

Every fenced block is found with its file, line and language. Python blocks run in tests/test_docs.py (and
tests/serving/test_serving_docs.py, the ones that need a running server). Shell blocks cannot all run (a Dataflow
job, `docker run`, a 20,000-step pretraining), so each command line in them is checked against the parser that would
read it: an `elmo-tf` subcommand (or a script of training/, export/, serving/) by that subcommand's own argparse
parser, so a renamed, misspelt or missing flag, or a value of the wrong type, fails; `tensorflow_model_server` and
`docker run tensorflow/serving` by `elmo-tf serve`'s parser, which takes stock TF Serving's flags; `make` by the
Makefile's targets. A command with `...` in it is a sketch of the one above it: only its flags' names are checked.
"""

import argparse
import contextlib
import dataclasses
import functools
import io
import re
import shlex
from pathlib import Path

from elmo_tf.cli.main import command_main

REPO_ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = {"python", "bash", "yaml", "text"}

# the repository's scripts -> the subcommand whose `main` they run
SCRIPTS = {
    "training/build_vocab.py": "build-vocab",
    "training/pretrain.py": "pretrain",
    "training/evaluate_lm.py": "evaluate-lm",
    "training/train_ner.py": "train-ner",
    "training/tune_ner.py": "tune-ner",
    "training/tag.py": "tag",
    "export/export_savedmodel.py": "export",
    "export/export_tagger.py": "export-tagger",
    "serving/serve.py": "serve",
}
# programs whose command lines are not checked (their own tools), beside the ones checked below
UNCHECKED = {"pip", "curl", "bash", "cd", "mkdir", "export"}


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str

    @property
    def where(self):
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def doc_files():
    """README.md and every Markdown file of docs/ (the API reference is generated at build time, not a file)."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def code_blocks(path):
    """The fenced blocks of a Markdown file, indented ones (inside list items) included, their code dedented."""
    blocks, fence, start, lines = [], None, 0, []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        if fence is None:
            if stripped.startswith("```"):
                fence, indent, start, lines = stripped[3:].strip(), len(line) - len(stripped), number, []
        elif stripped.startswith("```"):
            blocks.append(Block(Path(path), start, fence, "\n".join(lines) + "\n"))
            fence = None
        else:
            lines.append(line[indent:] if line[:indent].strip() == "" else line)
    return blocks


def all_blocks(language=None):
    return [b for path in doc_files() for b in code_blocks(path) if language is None or b.language == language]


def shell_commands(code):
    """The command lines of a shell block: continuation lines joined, comments dropped; each as its tokens."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        for i in reversed([i for i, t in enumerate(tokens) if t in ("<", ">")]):  # redirections
            del tokens[i : i + 2]
        while tokens and re.fullmatch(r"[A-Z_]+=.*", tokens[0]):  # VAR=value before the command
            tokens = tokens[1:]
        if tokens:
            commands.append(tokens)
    return commands


class _Parsed(Exception):
    def __init__(self, parser, namespace, extra):
        super().__init__("parsed")
        self.parser, self.namespace, self.extra = parser, namespace, extra


@contextlib.contextmanager
def _stop_at_parsing(parse=True):
    """While active, the first top-level `parse_args` / `parse_known_args` of any argparse parser raises `_Parsed`
    instead of returning, so a command's `main` stops before it touches a file: after parsing for real, or, with
    `parse=False`, before (only the parser is wanted)."""
    originals = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    depth = [0]

    def stopping(original, known):
        def parse_method(self, args=None, namespace=None):
            if not parse:
                raise _Parsed(self, None, [])
            depth[0] += 1
            try:
                result = original(self, args, namespace)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # parse_args calls parse_known_args: only the outer call stops
                raise _Parsed(self, *(result if known else (result, [])))
            return result

        return parse_method

    argparse.ArgumentParser.parse_args = stopping(originals[0], known=False)
    argparse.ArgumentParser.parse_known_args = stopping(originals[1], known=True)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = originals


def parse_subcommand(name, argv):
    """Parses `elmo-tf NAME ARGV` with the subcommand's own parser and nothing else; returns `(namespace, extra)` (the
    arguments the parser left to another, e.g. Beam's pipeline options). An argparse error is an AssertionError with
    argparse's message."""
    stderr = io.StringIO()
    with _stop_at_parsing(), contextlib.redirect_stderr(stderr):
        try:
            command_main(name)(list(argv), prog=f"elmo-tf {name}")
        except _Parsed as parsed:
            return parsed.namespace, parsed.extra
        except SystemExit as e:
            message = f"elmo-tf {name} {shlex.join(argv)}: {stderr.getvalue().strip()} (exit {e.code})"
            raise AssertionError(message) from None
    raise AssertionError(f"elmo-tf {name}: its main returned without parsing its arguments")


MISSING = re.compile(r"(no such file|not a directory): '([^']+)'")


def parse_with_placeholders(name, argv, attempts=20):
    """`parse_subcommand`, run in the current directory, where each file or directory the parser finds missing is
    made (empty) and the parse tried again: the docs name files the reader has, and only the flags are checked here.
    Returns `(namespace, extra)`."""
    for _ in range(attempts):
        try:
            return parse_subcommand(name, argv)
        except AssertionError as e:
            missing = MISSING.search(str(e))
            if missing is None or Path(missing.group(2)).is_absolute():
                raise
            kind, path = missing.groups()
            if kind == "not a directory":
                Path(path).mkdir(parents=True, exist_ok=True)
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).touch()
    raise AssertionError(f"elmo-tf {name} {shlex.join(argv)}: still missing files after {attempts} placeholders")


@functools.cache
def known_flags(name):
    """The flags `elmo-tf NAME` knows: those of the parser its `main` builds (taken before it parses anything)."""
    with _stop_at_parsing(parse=False):
        try:
            command_main(name)([], prog=f"elmo-tf {name}")
        except _Parsed as parsed:
            return frozenset(parsed.parser._option_string_actions)
    raise AssertionError(f"elmo-tf {name}: its main returned without parsing its arguments")


@functools.cache
def beam_flags():
    """The flags Beam's PipelineOptions know (the ones `elmo-tf beam-embed` passes on to Beam)."""
    from elmo_tf.cli.beam_embed import beam_parser

    return frozenset(beam_parser()._option_string_actions)


def makefile_targets():
    text = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, flags=re.M))


def subcommand_of(tokens):
    """`(subcommand, its arguments)` of an elmo_tf command line, or None for another program."""
    program = tokens[0]
    if program == "elmo-tf":
        return tokens[1], tokens[2:]
    if program.endswith("python") or program.endswith("python3"):
        if tokens[1:3] == ["-m", "elmo_tf"]:
            return tokens[3], tokens[4:]
        if tokens[1:3] == ["-m", "elmo_tf.beam"]:
            return "beam-embed", tokens[3:]
        if tokens[1] in SCRIPTS:
            return SCRIPTS[tokens[1]], tokens[2:]
    return None


def check_command(tokens):
    """Checks one command line of a shell block (see the module docstring); returns what was checked, for messages.
    Raises AssertionError naming the command and what is wrong."""
    command = shlex.join(tokens)
    sketch = "..." in tokens
    found = subcommand_of(tokens)
    if found:
        name, argv = found
        if sketch:
            flags = known_flags(name) | (beam_flags() if name == "beam-embed" else set())
            unknown = [t.split("=")[0] for t in argv if t.startswith("--") and t.split("=")[0] not in flags]
            assert not unknown, f"{command}: elmo-tf {name} knows no {unknown}"
            return f"flags of elmo-tf {name}"
        _namespace, extra = parse_with_placeholders(name, argv)
        if name == "beam-embed":
            from elmo_tf.cli.beam_embed import pipeline_options

            pipeline_options(extra)
        else:  # serve would hand flags it does not know to tensorflow_model_server: the docs use none
            assert not extra, f"{command}: unrecognized {extra}"
        return f"elmo-tf {name}"
    program = tokens[0]
    if program == "tensorflow_model_server":
        parse_with_placeholders("serve", tokens[1:])
        return "stock flags, by elmo-tf serve's parser"
    if program == "docker":
        image = next(i for i, t in enumerate(tokens) if t.startswith("tensorflow/serving"))
        env = dict(t.split("=", 1) for i, t in enumerate(tokens) if i and tokens[i - 1] == "-e")
        flags = [f"--model_name={env.get('MODEL_NAME', 'model')}", f"--model_base_path=/models/{env.get('MODEL_NAME')}"]
        parse_with_placeholders("serve", [*flags, *tokens[image + 1 :]])  # the image's entrypoint adds the first two
        return "the image's flags, by elmo-tf serve's parser"
    if program == "make":
        assert set(tokens[1:2]) <= makefile_targets(), f"{command}: no such Makefile target"
        return "a Makefile target"
    assert program in UNCHECKED, f"{command}: a program the docs test does not know ({program})"
    return "not checked"
