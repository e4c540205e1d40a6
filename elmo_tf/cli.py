"""Helpers for the command lines (argparse types)."""

import argparse


def positive_int(name):
    """An argparse `type` accepting integers >= 1; the error names the flag and the value received."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value

    return parse
