"""Vocabulary files of `entry<TAB>id` lines (the char and word vocabularies an options.json names).

One entry per line, UTF-8, lines separated by "\\n"; the entry is everything before the line's one tab (any
character but tab and newline, spaces included), the id a non-negative decimal int. Written by `elmo-tf convert`
from ELMoForManyLangs' `char.dic` / `word.dic` after reading them as that package does.
"""

import os
import stat

from elmo_tf.errors import ElmoTFError


class EntryIdsError(ElmoTFError):
    """A vocabulary file that cannot be read, or a malformed line: the message names the file and the line."""


def read_entry_ids(path):
    """The `(entry, id)` pairs of an `entry<TAB>id` file, in file order.

    Raises:
        EntryIdsError: a missing or unreadable file, one that is not a regular file (a FIFO, a device), text
            that is not UTF-8, or a line that is not `entry<TAB>id` with a non-negative int id (naming `path:line`).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # checked before opening: a FIFO blocks, /dev/zero never ends
            raise EntryIdsError(f"{path}: not a regular file (a vocabulary is a text file)", path=str(path))
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise EntryIdsError(f"{path}: cannot read the vocabulary: {e.strerror}", path=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EntryIdsError(f"{path}: not UTF-8 text (byte {e.start})", path=str(path)) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pairs = []
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != 2 or not fields[1].isascii() or not fields[1].isdigit():
            raise EntryIdsError(
                f"{path}:{number}: expected 'entry<TAB>id' with a non-negative int id, got {line[:60]!r}",
                path=str(path),
                line=number,
            )
        pairs.append((fields[0], int(fields[1])))
    return pairs


def entry_ids_text(pairs):
    """The text of an `entry<TAB>id` file for `pairs` (entries hold no tab and no newline)."""
    for entry, _ in pairs:
        if "\t" in entry or "\n" in entry:
            raise EntryIdsError(f"vocabulary entry {entry!r} holds a tab or a newline")
    return "".join(f"{entry}\t{i}\n" for entry, i in pairs)
