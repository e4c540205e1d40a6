"""Shared by the NER command-line tests: a tiny CoNLL-2003-like corpus of template sentences, running a
command-line script in a subprocess, and a converted ELMoForManyLangs biLM made once per test process."""

import os
import socket
import sys
from pathlib import Path

import forked
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT.parent / "shared" / "data"
ALLENNLP = DATA_DIR / "elmo_fixtures" / "allennlp"
TRAIN_NER = REPO_ROOT / "training" / "train_ner.py"
TAG = REPO_ROOT / "training" / "tag.py"
TIMEOUT = 300  # seconds for one CLI run; the tiny runs take 5-15 s on 2 busy cores

PEOPLE = ["John Smith", "Mary", "Ahmed Khan", "Li Wei", "Peter Blackburn", "Anna", "Jose Maria Aznar"]
PLACES = ["Paris", "New York", "Berlin", "Tokyo", "Cape Town", "Lima"]
ORGS = ["Reuters", "United Nations", "Siemens", "FIFA", "Bank of Japan"]
TEMPLATES = [
    "{PER} visited {LOC} on Monday .",
    "{ORG} said {PER} will leave {LOC} .",
    "{PER} joined {ORG} in {LOC} .",
    "Shares of {ORG} rose 3 percent .",
    "It rained in {LOC} .",
    "{PER} and {PER} met .",
]


def synthetic_sentence(rng):
    tokens, tags = [], []
    for part in rng.choice(TEMPLATES).split():
        if part.startswith("{"):
            kind = part[1:4]
            for word in rng.choice({"PER": PEOPLE, "LOC": PLACES, "ORG": ORGS}[kind]).split():
                tokens.append(word)
                tags.append(f"I-{kind}")
        else:
            tokens.append(part)
            tags.append("O")
    return tokens, tags


def write_corpus(directory, sizes=(("train", 40), ("dev", 12), ("test", 12)), seed=0):
    """CoNLL-2003-like files (4 columns, IOB1, -DOCSTART-) of template sentences; returns {split: path}."""
    paths = {}
    for k, (split, n) in enumerate(sizes):
        rng = np.random.default_rng(seed + k)
        path = Path(directory) / f"{split}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.write("-DOCSTART- -X- O O\n\n")
            for _ in range(n):
                tokens, tags = synthetic_sentence(rng)
                f.writelines(f"{t} NNP I-NP {g}\n" for t, g in zip(tokens, tags))
                f.write("\n")
        paths[split] = path
    return paths


def subprocess_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    return env


def run_cli(script, *args, input=None, timeout=TIMEOUT):
    return forked.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def error_line(result):
    """The last stderr line (argparse's one-line error)."""
    return result.stderr.strip().splitlines()[-1]


_CONVERTED_EFML = {}


def shared_converted_efml(tmp_path_factory, variant="word"):
    """`convert_testlib.converted_efml(..., variant)`, converted once per test process into the session's temporary
    directory and then shared by the tests that use it (tests/ner/test_pipeline.py, tests/cli/test_train_ner.py):
    read it, never write into it."""
    if variant not in _CONVERTED_EFML:
        from convert_testlib import converted_efml

        _CONVERTED_EFML[variant] = converted_efml(tmp_path_factory.mktemp(f"efml_{variant}") / "elmo", variant)
    return _CONVERTED_EFML[variant]
