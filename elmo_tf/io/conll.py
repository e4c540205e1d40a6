"""CoNLL-format NER files: CoNLL-2003 (4 columns, IOB1, -DOCSTART-) and WNUT-17 (2 columns, IOB2)."""

import dataclasses

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.text import TextFileError, iter_lines


@dataclasses.dataclass
class Sentence:
    tokens: list
    tags: list
    line: int  # 1-based line of the first token, for messages


class ConllFormatError(ElmoTFError):
    """A file that is not CoNLL data; the message names the file and the line (`path:line: ...`)."""


def read_conll(path, token_column=0, tag_column=-1):
    """Sentences of a CoNLL file: tokens and tags by column (whitespace-separated; tab for 2 columns).

    The file is UTF-8 (a leading byte order mark is skipped), lines end in "\\n" or "\\r\\n". Blank lines (and
    lines holding only whitespace, as in WNUT-17's train file) end a sentence; `-DOCSTART-` lines are skipped.

    Raises:
        ConllFormatError: naming the file and line (and the byte offset, for encoding errors): a line with a
            single column, a tag that is not O / X-TYPE, invalid UTF-8, a UTF-16 file, a NUL byte, no
            sentence at all; or a path that is missing or a directory.
    """
    sentences, tokens, tags, first = [], [], [], None
    try:
        for number, line in iter_lines(path):
            if not line.strip():
                if tokens:
                    sentences.append(Sentence(tokens, tags, first))
                tokens, tags, first = [], [], None
                continue
            columns = line.split("\t") if "\t" in line else line.split()
            columns = [c.strip() for c in columns]
            if columns[0] == "-DOCSTART-":
                continue
            if len(columns) < 2:
                raise ConllFormatError(f"{path}:{number}: expected a token and a tag, got {line!r}")
            try:
                tag, token = columns[tag_column], columns[token_column]
            except IndexError:
                raise ConllFormatError(
                    f"{path}:{number}: no column {token_column} (token) or {tag_column} (tag) in {line!r}"
                ) from None
            if tag != "O" and (len(tag) < 3 or tag[1] != "-" or tag[0] not in "BIES"):
                raise ConllFormatError(f"{path}:{number}: tag {tag!r} is neither 'O' nor B-/I-/E-/S-<type>")
            if first is None:
                first = number
            tokens.append(token)
            tags.append(tag)
    except TextFileError as e:
        raise ConllFormatError(str(e)) from None
    if tokens:
        sentences.append(Sentence(tokens, tags, first))
    if not sentences:
        raise ConllFormatError(f"{path}: no sentences found")
    return sentences
