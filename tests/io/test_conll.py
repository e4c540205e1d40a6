"""elmo_tf/io/conll.py: sentence and token counts of the real CoNLL-2003 and WNUT-17 files, sentence breaks
(blank, whitespace-only and tab-only lines), -DOCSTART-, columns, and errors naming the file and line.
"""

from pathlib import Path

import pytest

from elmo_tf.io.conll import ConllFormatError, Sentence, read_conll

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"

COUNTS = [  # (file, sentences, tokens)
    ("conll2003/eng.train", 14041, 203621),
    ("conll2003/eng.testa", 3250, 51362),
    ("conll2003/eng.testb", 3453, 46435),
    ("wnut17/wnut17train.conll", 3394, 62730),
    ("wnut17/emerging.dev.conll", 1009, 15733),
    ("wnut17/emerging.test.annotated", 1287, 23394),
]


def data_file(relative):
    path = DATA_DIR / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data is not checked out)")
    return path


@pytest.mark.parametrize("relative,num_sentences,num_tokens", COUNTS, ids=[c[0] for c in COUNTS])
def test_counts_of_the_real_files(relative, num_sentences, num_tokens):
    path = data_file(relative)
    sentences = read_conll(path)
    assert len(sentences) == num_sentences
    assert sum(len(s.tokens) for s in sentences) == num_tokens
    assert all(len(s.tokens) == len(s.tags) > 0 for s in sentences)
    assert all(t == "O" or t[:2] in ("B-", "I-") for s in sentences for t in s.tags)
    assert "-DOCSTART-" not in {s.tokens[0] for s in sentences}
    lines = path.read_text(encoding="utf-8").split("\n")
    for s in sentences[:50] + sentences[-50:]:  # `line` is the 1-based line of the first token
        assert lines[s.line - 1].split()[0] == s.tokens[0]


def test_conll2003_first_sentence_and_columns():
    path = data_file("conll2003/eng.train")
    first = read_conll(path)[0]
    assert first.tokens == ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    assert first.tags == ["I-ORG", "O", "I-MISC", "O", "O", "O", "I-MISC", "O", "O"]
    assert first.line == 3
    chunks = read_conll(path, tag_column=2)[0]
    assert chunks.tags == ["I-NP", "I-VP", "I-NP", "I-NP", "I-VP", "I-VP", "I-NP", "I-NP", "O"]


def test_wnut17_train_has_tab_only_sentence_breaks():
    path = data_file("wnut17/wnut17train.conll")
    lines = path.read_text(encoding="utf-8").split("\n")
    assert sum(line == "\t" for line in lines) > 1000  # the quirk this reader must handle
    sentences = read_conll(path)
    assert sentences[0].tokens[:3] == ["@paulwalk", "It", "'s"]
    assert all("\t" not in t and t for s in sentences for t in s.tokens)


def write(tmp_path, text, name="data.txt"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_sentence_breaks_docstart_and_line_endings(tmp_path):
    text = (
        "-DOCSTART- -X- O O\n\n"
        "John NNP B-NP I-PER\nSmith NNP I-NP I-PER\n"
        "\t\n"  # tab only (WNUT-17)
        "visited VBD B-VP O\n"
        "   \n\n\n"  # spaces only, then several blank lines
        "-DOCSTART- -X- O O\n"
        "Paris NNP B-NP I-LOC\r\n"  # CRLF
        ". . O O"
    )  # no final newline
    sentences = read_conll(write(tmp_path, text))
    assert [(s.tokens, s.tags, s.line) for s in sentences] == [
        (["John", "Smith"], ["I-PER", "I-PER"], 3),
        (["visited"], ["O"], 6),
        (["Paris", "."], ["I-LOC", "O"], 11),
    ]
    assert isinstance(sentences[0], Sentence)


def test_two_tab_separated_columns_keep_unicode_tokens(tmp_path):
    sentences = read_conll(write(tmp_path, "Zürich\tB-location\nnaïve café\tO\n\n@user\tO\n"))
    assert sentences[0].tokens == ["Zürich", "naïve café"]  # a tab line is split on tabs only
    assert sentences[0].tags == ["B-location", "O"]
    assert sentences[1].tokens == ["@user"]


@pytest.mark.parametrize(
    "text,line,needle",
    [
        ("a O\nb\nc O\n", 2, "expected a token and a tag"),  # one column
        ("a O\n\nb PER\n", 3, "'PER'"),  # a tag without prefix
        ("a O\nb X-PER\n", 2, "'X-PER'"),  # an unknown prefix
        ("a O\nb B-\n", 2, "'B-'"),  # a prefix without type
        ("x\tO\ny\tIPER\n", 2, "'IPER'"),
    ],
)
def test_malformed_lines_raise_naming_file_and_line(tmp_path, text, line, needle):
    path = write(tmp_path, text, "bad.conll")
    with pytest.raises(ConllFormatError) as info:
        read_conll(path)
    message = str(info.value)
    assert f"{path}:{line}:" in message and needle in message
    assert isinstance(info.value, ValueError)


def test_empty_and_missing_files_raise_naming_the_file(tmp_path):
    empty = write(tmp_path, "\n\n-DOCSTART- -X- O O\n\n", "empty.conll")
    with pytest.raises(ConllFormatError, match="empty.conll.*no sentences"):
        read_conll(empty)
    with pytest.raises(ConllFormatError, match="missing.conll"):
        read_conll(tmp_path / "missing.conll")
