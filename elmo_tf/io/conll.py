"""CoNLL-format NER files: CoNLL-2003 (4 columns, IOB1, -DOCSTART-) and WNUT-17 (2 columns, IOB2)."""

import dataclasses


@dataclasses.dataclass
class Sentence:
    tokens: list
    tags: list
    line: int  # 1-based line of the first token, for messages


class ConllFormatError(ValueError):
    """A malformed line; the message names the file and line."""


def read_conll(path, token_column=0, tag_column=-1):
    """Sentences of a CoNLL file: tokens and tags by column (whitespace-separated; tab for 2 columns).

    Blank lines (and lines holding only whitespace, as in WNUT-17's train file) end a sentence;
    `-DOCSTART-` lines are skipped. A line with a single column, or a tag that is not O / X-TYPE, raises
    `ConllFormatError` naming the file and line.
    """
    sentences, tokens, tags, first = [], [], [], None
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise ConllFormatError(f"cannot read {path!r}: {e}") from None
    with f:
        for number, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
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
            tag = columns[tag_column]
            if tag != "O" and (len(tag) < 3 or tag[1] != "-" or tag[0] not in "BIES"):
                raise ConllFormatError(f"{path}:{number}: tag {tag!r} is neither 'O' nor B-/I-/E-/S-<type>")
            if first is None:
                first = number
            tokens.append(columns[token_column])
            tags.append(tag)
    if tokens:
        sentences.append(Sentence(tokens, tags, first))
    if not sentences:
        raise ConllFormatError(f"{path}: no sentences found")
    return sentences
