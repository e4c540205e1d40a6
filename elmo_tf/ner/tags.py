"""NER tag schemes (IOB1, IOB2, BIOES): conversion, spans, and the CRF transition constraints of each.

Tags are "O" or "<prefix>-<type>": IOB1 (CoNLL-2003: I- everywhere, B- only between two adjacent
entities of the same type), IOB2 (B- starts every entity), BIOES (S- single-token entities, E- ends).
"""

import numpy as np

SCHEMES = ("iob1", "iob2", "bioes")
PREFIXES = {"iob1": ("B", "I"), "iob2": ("B", "I"), "bioes": ("B", "I", "E", "S")}  # the forms of a type


def _split(tag):
    if tag == "O":
        return "O", None
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S") or not kind:
        raise ValueError(f"tag {tag!r} is neither 'O' nor '<B|I|E|S>-<type>'")
    return prefix, kind


def spans(tags, scheme="iob2"):
    """Entity spans `(type, start, end_exclusive)` as conlleval reads them (an I- after O or after
    another type starts a new entity, in every scheme; E-/S- close one)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    result, start, kind = [], None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, new_kind = _split(tag)
        ends = prefix in ("O", "B", "S") or (prefix in ("I", "E") and new_kind != kind)
        if start is not None and ends:
            result.append((kind, start, i))
            start, kind = None, None
        if prefix in ("B", "S") or (prefix in ("I", "E") and start is None):
            start, kind = i, new_kind
        if prefix in ("E", "S") and start is not None:
            result.append((kind, start, i + 1))
            start, kind = None, None
    return result


def entity_type(tag):
    """The entity type of a tag ("PER" of "B-PER"), None for "O"."""
    return _split(tag)[1]


def labels_for(types, scheme="bioes"):
    """Every tag `scheme` has for the entity `types`: "O" first, then each prefix of the scheme with each type,
    sorted ("B-LOC", "B-PER", "E-LOC", ...). A tagger's label set, so that every form of a type seen in training is
    a label even when training holds only some of them (a single-token LOC, never a multi-token one)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    for kind in types:
        _split(f"B-{kind}")  # a type that would not make a tag
    return ["O"] + sorted(f"{prefix}-{kind}" for prefix in PREFIXES[scheme] for kind in set(types))


def from_spans(length, entity_spans, scheme="iob2"):
    """Tags of a sentence of `length` tokens holding `entity_spans` in the given scheme."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    tags = ["O"] * length
    previous_end, previous_kind = None, None
    for kind, start, end in sorted(entity_spans, key=lambda s: s[1]):
        for i in range(start, end):
            tags[i] = f"I-{kind}"
        if scheme == "iob2":
            tags[start] = f"B-{kind}"
        elif scheme == "bioes":
            if end - start == 1:
                tags[start] = f"S-{kind}"
            else:
                tags[start], tags[end - 1] = f"B-{kind}", f"E-{kind}"
        elif previous_end == start and previous_kind == kind:  # iob1: B- only to split touching entities
            tags[start] = f"B-{kind}"
        previous_end, previous_kind = end, kind
    return tags


def convert(tags, source, target):
    """Re-tags a sentence from one scheme to another (through its spans)."""
    return from_spans(len(tags), spans(tags, source), target)


def allowed_transitions(labels, scheme="iob2"):
    """CRF constraints for `labels` (list of tag strings): `(transitions (K, K), start (K,), end (K,))` bool.

    IOB2: I-X only after B-X or I-X. BIOES: B-X/I-X must continue with I-X or E-X; E-X, S-X and O are
    followed by O, B-* or S-*. IOB1 allows everything (I- starts entities there).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    parsed = [_split(t) for t in labels]
    k = len(labels)
    trans, start, end = np.ones((k, k), bool), np.ones(k, bool), np.ones(k, bool)
    if scheme == "iob1":
        return trans, start, end
    for j, (pj, kj) in enumerate(parsed):
        if scheme == "iob2":
            start[j] = pj != "I"
        else:
            start[j] = pj in ("O", "B", "S")
            end[j] = pj in ("O", "E", "S")
        for i, (pi, ki) in enumerate(parsed):
            if scheme == "iob2":
                trans[i, j] = pj != "I" or (pi in ("B", "I") and ki == kj)
            else:
                continues = pi in ("B", "I")
                trans[i, j] = (pj in ("I", "E") and ki == kj) if continues else pj in ("O", "B", "S")
    return trans, start, end
