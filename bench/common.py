"""Small helpers shared by the benchmark scripts (flag parsing, provenance)."""

import argparse
import subprocess


def parse_list(text, kind, name):
    """A comma-separated flag value as a list of `kind`; ArgumentTypeError naming the flag when bad or empty."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: cannot parse {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{name}: empty list")
    return values


def git_commit(repo):
    """The checked-out commit of `repo`, or None outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
