"""elmo_tf/ner/tags.py: IOB1/IOB2/BIOES conversion round trips on the real CoNLL-2003 and WNUT-17 files
(spans preserved), `allowed_transitions` against an enumeration of valid tag sequences, `spans` on tricky
sequences and against seqeval's conlleval-style chunker on random sequences.
"""

import itertools
from pathlib import Path

import numpy as np
import pytest
from seqeval.metrics.sequence_labeling import get_entities

from elmo_tf.io.conll import read_conll
from elmo_tf.ner.tags import SCHEMES, allowed_transitions, convert, from_spans, labels_for, spans

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
FILES = [  # (path relative to the data dir, the file's scheme)
    ("conll2003/eng.train", "iob1"),
    ("conll2003/eng.testa", "iob1"),
    ("conll2003/eng.testb", "iob1"),
    ("wnut17/wnut17train.conll", "iob2"),
    ("wnut17/emerging.dev.conll", "iob2"),
    ("wnut17/emerging.test.annotated", "iob2"),
]


def data_file(relative):
    path = DATA_DIR / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data is not checked out)")
    return path


def is_canonical_iob1(tags):
    """B-X only right after an X entity token (CoNLL-2003's rule); everything else starts with I-."""
    previous = "O"
    for tag in tags:
        if tag.startswith("B-") and previous[2:] != tag[2:]:
            return False
        previous = tag
    return True


@pytest.mark.parametrize("relative,scheme", FILES, ids=[f[0] for f in FILES])
def test_conversions_preserve_spans_and_round_trip_on_real_files(relative, scheme):
    sentences = read_conll(data_file(relative))
    non_canonical = []
    for s in sentences:
        original = spans(s.tags, scheme)
        canonical = convert(s.tags, scheme, scheme)
        assert spans(canonical, scheme) == original
        if canonical != s.tags:
            non_canonical.append(s)
        for target in SCHEMES:
            converted = convert(s.tags, scheme, target)
            assert len(converted) == len(s.tags)
            assert spans(converted, target) == original, f"{relative}:{s.line}: spans changed in {target}"
            assert convert(converted, target, scheme) == canonical, f"{relative}:{s.line}: {target} round trip"
            assert from_spans(len(s.tags), original, target) == converted
    # the files are canonical, except CoNLL-2003 sentences with a B- that starts an entity after O or another
    # type (an annotation quirk: conlleval reads the same spans either way)
    if scheme == "iob1":
        assert [s.line for s in non_canonical] == [s.line for s in sentences if not is_canonical_iob1(s.tags)]
        assert len(non_canonical) <= 10
    else:
        assert non_canonical == []


def test_iob1_conversion_examples():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]
    assert convert(iob1, "iob1", "iob2") == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG"]
    assert convert(iob1, "iob1", "bioes") == ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "B-ORG", "E-ORG"]
    assert convert(convert(iob1, "iob1", "bioes"), "bioes", "iob1") == iob1
    assert convert([], "iob1", "bioes") == []


@pytest.mark.parametrize(
    "tags,expected",
    [
        (["O", "I-PER", "I-PER", "O"], [("PER", 1, 3)]),  # I- after O starts an entity
        (["B-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # type change
        (["I-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),
        (["I-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),  # B- splits touching entities
        (["B-PER", "E-PER", "E-PER"], [("PER", 0, 2), ("PER", 2, 3)]),  # E- closes; a lone E- is one token
        (["S-PER", "I-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 3)]),  # S- is one token
        (["B-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["O", "E-LOC", "O"], [("LOC", 1, 2)]),
        (["B-PER", "I-PER", "E-LOC"], [("PER", 0, 2), ("LOC", 2, 3)]),  # E- of another type
        (["B-MISC"], [("MISC", 0, 1)]),  # entity at the sentence end
        (["O", "O"], []),
        ([], []),
    ],
)
def test_spans_on_tricky_sequences(tags, expected):
    for scheme in SCHEMES:
        assert spans(tags, scheme) == expected


def test_spans_equal_seqeval_on_random_sequences():
    """seqeval's default (conlleval-compatible) chunker finds the same entities on arbitrary B/I/E/S/O mixes."""
    rng = np.random.default_rng(0)
    labels = ["O"] + [f"{p}-{t}" for p in "BIES" for t in ("PER", "LOC")]
    for _ in range(3000):
        tags = [labels[i] for i in rng.integers(0, len(labels), size=rng.integers(0, 9))]
        expected = sorted((kind, start, end + 1) for kind, start, end in get_entities(tags))
        assert sorted(spans(tags, "bioes")) == expected, tags


def test_bad_tags_and_schemes_raise():
    with pytest.raises(ValueError, match="PER"):
        spans(["PER"], "iob2")
    with pytest.raises(ValueError, match="X-PER"):
        spans(["X-PER"], "iob2")
    with pytest.raises(ValueError, match="scheme"):
        spans(["O"], "bilou")
    with pytest.raises(ValueError, match="scheme"):
        allowed_transitions(["O"], "iob3")


def reference_constraints(labels, scheme, max_length=4):
    """Transitions, starts and ends that occur in some canonical sentence of length <= max_length (a sentence
    is valid when it equals the tags written from its own spans)."""
    k = len(labels)
    trans, start, end = np.zeros((k, k), bool), np.zeros(k, bool), np.zeros(k, bool)
    for length in range(1, max_length + 1):
        for ids in itertools.product(range(k), repeat=length):
            tags = [labels[i] for i in ids]
            if from_spans(length, spans(tags, scheme), scheme) != tags:
                continue
            start[ids[0]] = end[ids[-1]] = True
            for a, b in zip(ids, ids[1:]):
                trans[a, b] = True
    return trans, start, end


@pytest.mark.parametrize("scheme", ["iob2", "bioes"])
def test_allowed_transitions_forbid_exactly_the_invalid_moves(scheme):
    prefixes = "BI" if scheme == "iob2" else "BIES"
    labels = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC") for p in prefixes]
    trans, start, end = allowed_transitions(labels, scheme)
    ref_trans, ref_start, ref_end = reference_constraints(labels, scheme)
    for i, a in enumerate(labels):
        for j, b in enumerate(labels):
            assert trans[i, j] == ref_trans[i, j], f"{scheme}: {a} -> {b}"
    assert start.tolist() == ref_start.tolist() and end.tolist() == ref_end.tolist()
    assert trans.dtype == bool and trans.shape == (len(labels), len(labels))


def test_allowed_transitions_spot_checks():
    labels = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
    trans, start, end = allowed_transitions(labels, "bioes")
    ids = {label: i for i, label in enumerate(labels)}
    assert trans[ids["B-PER"], ids["I-PER"]] and trans[ids["I-PER"], ids["E-PER"]]
    assert not trans[ids["O"], ids["I-PER"]] and not trans[ids["B-PER"], ids["E-LOC"]]
    assert not trans[ids["B-PER"], ids["O"]] and not trans[ids["E-PER"], ids["I-PER"]]
    assert not start[ids["E-PER"]] and not end[ids["B-PER"]] and start[ids["S-LOC"]] and end[ids["O"]]
    # IOB1 is documented to allow every move: I- starts entities, B- only splits touching ones
    trans, start, end = allowed_transitions(["O", "B-PER", "I-PER"], "iob1")
    assert trans.all() and start.all() and end.all()


def test_labels_for_gives_every_form_of_every_type():
    """A tagger's label set: "O", then each prefix of the scheme with each type, sorted (whatever forms data had)."""
    assert labels_for({"PER", "LOC"}, "bioes") == [
        "O", "B-LOC", "B-PER", "E-LOC", "E-PER", "I-LOC", "I-PER", "S-LOC", "S-PER"
    ]  # fmt: skip
    assert labels_for(["creative-work", "PER", "PER"], "iob2") == [
        "O", "B-PER", "B-creative-work", "I-PER", "I-creative-work"
    ]  # fmt: skip
    assert labels_for(["PER"], "iob1") == ["O", "B-PER", "I-PER"]
    assert labels_for([], "bioes") == ["O"]
    for scheme in SCHEMES:  # every tag a sentence of these types converts to is a label
        labels = set(labels_for({"PER", "LOC"}, scheme))
        for source in SCHEMES:
            tags = from_spans(6, [("PER", 0, 1), ("PER", 1, 3), ("LOC", 4, 6)], source)
            assert set(convert(tags, source, scheme)) <= labels
    with pytest.raises(ValueError, match="scheme"):
        labels_for(["PER"], "bilou")
