"""Text files read line by line, with errors that name the file, the line and the byte offset.

Every text input of elmo_tf is UTF-8, one record per line, lines ending in "\\n" or "\\r\\n". A UTF-8 byte order
mark at the start is skipped. A UTF-16/UTF-32 file (a byte order mark, or NUL bytes) and a binary file (NUL
bytes) are rejected; invalid UTF-8 is an error for the readers that decode (`iter_lines`), and is kept byte for
byte by those that do not (`raw_lines`, `count_lines`: the embedder and the LM data pipeline work on bytes).
"""

import codecs

from elmo_tf.errors import ElmoTFError

_WIDE_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # UTF-32 LE starts like UTF-16 LE; UTF-32 BE with NULs


class TextFileError(ElmoTFError):
    """A text file that cannot be read as UTF-8 lines. The message starts with `path:line:` (or `path:`)."""


def _open(path):
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise TextFileError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise TextFileError(f"{path}: {e.strerror or e}") from None


def raw_lines(path):
    """Yields `(line number, offset, bytes)` for each line of `path`: 1-based number, byte offset of the line's
    first byte in the file, the line without its "\\n" / "\\r\\n" (and without a leading UTF-8 byte order mark).

    Raises:
        TextFileError: a missing file or a directory; a UTF-16/UTF-32 byte order mark; a NUL byte (binary or
            UTF-16 data). The message names the file, the line and the byte offset.
    """
    with _open(path) as f:
        yield from raw_lines_of(f, path)


def raw_lines_of(f, path):
    """`raw_lines` over `f`, a binary file object already open (a Beam filesystem's stream, for one); `path` names
    it in the errors."""
    offset = 0
    for number, line in enumerate(f, start=1):
        start, length = offset, len(line)
        offset += length
        if number == 1:
            if line.startswith(codecs.BOM_UTF8):
                line, start = line[len(codecs.BOM_UTF8) :], start + len(codecs.BOM_UTF8)
            elif line.startswith(_WIDE_BOMS):
                raise TextFileError(
                    f"{path}:1: starts with a UTF-16/UTF-32 byte order mark; the file must be UTF-8 "
                    "(convert it, e.g. iconv -f UTF-16 -t UTF-8)"
                )
        nul = line.find(b"\0")
        if nul >= 0:
            raise TextFileError(
                f"{path}:{number}: NUL byte at byte offset {start + nul}: not a UTF-8 text file "
                "(binary data, or UTF-16/UTF-32 text?)"
            )
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield number, start, line


def decode_line(path, number, offset, line):
    """`line` (bytes from `raw_lines`) as str; invalid UTF-8 raises `TextFileError` naming the line and byte."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFileError(
            f"{path}:{number}: invalid UTF-8 (byte 0x{line[e.start]:02x} at byte offset {offset + e.start})"
        ) from None


def iter_lines(path):
    """Yields `(line number, text)` for each line of a UTF-8 file (see `raw_lines`; invalid UTF-8 raises)."""
    for number, offset, line in raw_lines(path):
        yield number, decode_line(path, number, offset, line)


def read_text(path):
    """The whole UTF-8 file as str (a leading byte order mark removed; line ends kept as "\\n")."""
    return "".join(text + "\n" for _, text in iter_lines(path))


def count_lines(path):
    """`(lines, lines with a token)` of `path`, checked as `raw_lines` does (invalid UTF-8 is allowed). Tokens
    are split on ASCII whitespace, as the embedder and `tf.strings.split` do."""
    lines = with_tokens = 0
    for _, _, line in raw_lines(path):
        lines += 1
        with_tokens += bool(line.split())
    return lines, with_tokens
