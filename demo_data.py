"""Demo data that the project writes itself: English-like sentences from a small grammar, with NER tags.

`make demo` must run on a fresh machine with no corpora and no downloads, so it generates its text here:
news-style sentences with person, location, organization and miscellaneous names (PER, LOC, ORG, MISC).
The same generator writes
  - plain text (one sentence per line, whitespace tokens) for pretraining the biLM, and
  - CoNLL files (token<TAB>tag, IOB2, blank line between sentences) for the NER head.

A sentence is a subject, a predicate and adjuncts drawn independently (`SUBJECTS`, `PREDICATES`, `PLACES`,
plus a few whole `TEMPLATES`), so each entity type comes in many contexts ("officials from ORG", "the MISC
government", "proposed by PER", "in LOC") and in combinations no template spells out. Names come from word lists
and, for a share of them, are made up from syllables (`pseudo_name`): most of those occur once, so the tagger
meets unknown names in training and learns to tag them from context and spelling rather than remember a list.
The NER test split draws its names from `HELD_OUT` lists the training split never sees, so it scores exactly
that. The sentences `demo.py` tags use names found in none of these lists (tests/test_demo.py checks that
they appear in no file written here).
Generation is deterministic for a seed. This is a toy corpus for exercising the pipeline, not a benchmark:
use `--data` with real corpora for numbers.
"""

import os
import random

FIRST = (
    "Anna Maria John Peter Laura David Sofia Ahmed Mei Carlos Elena Tom Fatima Lars Yuki Olga Samuel Priya Hans "
    "Grace Omar Julia Pablo Nina Ivan Leila Marco Sara Jonas Aisha Kenji Rosa Daniel Amara Viktor Helen"
).split()
LAST = (
    "Smith Schmidt Garcia Rossi Novak Tanaka Okafor Kowalski Dubois Jensen Silva Chen Haddad Murphy Ivanova Berg "
    "Costa Meyer Patel Larsen Nakamura Moreau Fischer Boateng Horvat Lindqvist Santos Kim Nowak Owusu Petrov Khan"
).split()
LOC = (
    "Berlin Paris Madrid Lisbon Warsaw Nairobi Lima Oslo Cairo Toronto Vienna Dublin Seoul Jakarta Chile Kenya "
    "Norway Canada Brazil Japan Athens Budapest Lagos Hanoi Bogota Helsinki Geneva Kiev Peru Egypt Poland Spain"
).split() + ["New York", "Buenos Aires", "South Africa", "Hong Kong", "Sri Lanka", "Rio de Janeiro"]
ORG = (
    "Siemens Reuters Oxfam Toyota Nestle Interpol UNESCO Fiat Nokia Airbus Greenpeace Unilever Sony Volvo "
    "Boeing Microsoft Ericsson Barclays Lufthansa Gazprom NATO FIFA"
).split() + [
    "the World Bank",
    "the Red Cross",
    "General Motors",
    "Deutsche Bank",
    "the European Union",
    "Real Madrid",
    "the African Union",
    "the Arab League",
    "the World Health Organization",
    "the Central Bank",
]
MISC = (
    "German French Japanese Brazilian Kenyan Canadian Irish Korean Spanish Polish Danish Turkish British "
    "Norwegian Chinese Russian Indian Egyptian Greek Austrian Portuguese Nigerian Peruvian Thai Israeli "
    "Pakistani Scottish Australian Olympic Christian Muslim Nobel Euro"
).split()
# The NER test split's names: in the biLM's text (as a real pretraining corpus would hold them), never in NER training.
HELD_OUT = {
    "FIRST": ["Lucia", "Ravi", "Nadia", "Felix", "Tariq", "Ines"],
    "LAST": ["Ferrari", "Sharma", "Popescu", "Weber", "Adeyemi", "Moreno"],
    "LOC": ["Accra", "Manila", "Quito", "Finland", "Morocco", "Cape Town", "Riga"],
    "ORG": ["Heineken", "Amnesty International", "Renault", "the Asian Development Bank", "Vodafone"],
    "MISC": ["Dutch", "Italian", "Mexican", "Hungarian", "Cuban"],
}

NOUNS = (
    "talks agreement report plan deal election match contract strike merger budget summit project investigation "
    "festival proposal treaty reform"
).split()
VERBS = (
    "announced criticized welcomed rejected signed discussed postponed praised questioned supported approved blocked"
).split()
TIMES = [
    "on Monday",
    "on Tuesday",
    "on Wednesday",
    "on Thursday",
    "on Friday",
    "last week",
    "in March",
    "in June",
    "this year",
    "in 2019",
    "yesterday",
]
NUMBERS = ["two", "three", "five", "12", "40", "several", "hundreds of", "1,200"]

# {X} slots: PER (full name), FIRST, LAST, LOC, ORG, MISC, NOUN, VERB, TIME, NUM; each part is drawn independently.
SUBJECTS = [
    "{PER}",
    "{PER}",
    "{LAST}",
    "{ORG}",
    "The {MISC} government",
    "{MISC} officials",
    "Officials from {ORG}",
    "A spokesman for {ORG}",
    "The head of {ORG}",
    "{PER} , who works for {ORG} ,",
    "{LAST} , the head of {ORG} ,",
    "{PER} , the {MISC} minister ,",
    "The mayor of {LOC}",
    "Police in {LOC}",
    "The {MISC} team",
]
PREDICATES = [
    "{VERB} the {NOUN}",
    "{VERB} the {NOUN} proposed by {PER}",
    "{VERB} the {NOUN} proposed by {ORG}",
    "{VERB} the {MISC} {NOUN}",
    "{VERB} a {NOUN} with {ORG}",
    "{VERB} a {NOUN} with the {MISC} government",
    "met {PER}",
    "met officials from {ORG}",
    "met executives from {ORG}",
    "met representatives of {ORG}",
    "met the {MISC} ambassador",
    "met the mayor of {LOC}",
    "arrived in {LOC}",
    "visited {LOC}",
    "flew to {LOC}",
    "returned from {LOC}",
    "said the {NOUN} was good news for {LOC}",
    "said the {NOUN} was good news for {ORG}",
    "told {MISC} reporters that the {NOUN} would continue",
    "won the {MISC} {NOUN}",
]
PLACES = ["in {LOC}", "in {LOC}", "after talks with {ORG}", "after talks in {LOC}", "near {LOC}"]  # then maybe {TIME}
TEMPLATES = [  # sentences of their own shape
    "Shares of {ORG} rose after the company {VERB} a {NOUN} with {ORG} .",
    "Shares of {ORG} fell {TIME} .",
    "{ORG} shares fell after {PER} {VERB} the {NOUN} .",
    "{NUM} people attended the {NOUN} in {LOC} {TIME} .",
    "Officials in {LOC} said {ORG} had {VERB} the {NOUN} .",
    "{LAST} told reporters in {LOC} that the {NOUN} would continue .",
    "The {NOUN} between {LOC} and {LOC} was {VERB} by {ORG} .",
    "{FIRST} said the {NOUN} was good news for {LOC} .",
    "According to {ORG} , {NUM} {MISC} workers joined the {NOUN} .",
    "It was not clear whether {ORG} {VERB} the {NOUN} .",
    "{PER} and {PER} {VERB} the {MISC} {NOUN} {TIME} .",
    "The {NOUN} {VERB} {TIME} was the first since {NUM} years ago .",
]

# Made-up names (`pseudo_name`): syllables, and endings that hint at the type as real names' endings do.
ONSETS = "b d f g h k l m n p r s t v z b d k l m n r s t br dr gr kr st tr sh".split()
VOWELS = "a e i o u a e o".split()
CODAS = ["", "", "n", "r", "l", "s", "m", "t"]  # after the last syllable
ENDINGS = {
    "FIRST": ["", "", "a", "o", "el", "ina"],
    "LAST": ["", "sen", "ova", "ez", "son", "ski", "ah", "elli"],
    "LOC": ["", "", "ia", "burg", "stad", "pur", "ville"],
    "ORG": ["", "", "ex", "tron", "co", "corp"],
    "MISC": ["ian", "ese", "ish", "i", "an"],
}
ORG_WORDS = ["Group", "Bank", "Airlines", "Motors", "Foundation", "Energy", "Telecom"]
PSEUDO_SHARE = 0.35  # of the entity slots of a sentence from the training lists
LISTED = {w for names in (FIRST, LAST, LOC, ORG, MISC, *HELD_OUT.values()) for name in names for w in name.split()}


def pseudo_name(rng, kind):
    """A made-up name of one entity type: "Davelo", "Kestaburg", "Tarish", "the Bolen Foundation"."""

    def word(syllables, ending):
        stem = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(CODAS)
        return (stem + ending).capitalize()

    if kind == "ORG" and rng.random() < 0.4:
        name = pseudo_name(rng, "LOC") + " " + rng.choice(ORG_WORDS)
        return "the " + name if rng.random() < 0.5 else name
    while True:  # never a listed name: the held-out ones stay unseen in training
        syllables = rng.choice([1, 2] if kind == "MISC" else [2, 2, 3] if kind == "FIRST" else [1, 2, 2, 3])
        name = word(syllables, rng.choice(ENDINGS[kind]))
        if name not in LISTED:
            return name


def _fill(rng, slot, names, pseudo):
    """(tokens, tags) for one slot."""
    if slot in ("PER", "FIRST", "LAST", "LOC", "ORG", "MISC"):
        parts = ["FIRST", "LAST"] if slot == "PER" else [slot]
        words = []
        for part in parts:
            name = pseudo_name(rng, part) if pseudo and rng.random() < PSEUDO_SHARE else rng.choice(names[part])
            words += name.split()
        kind = "PER" if slot in ("PER", "FIRST", "LAST") else slot
        start = 1 if words[0] == "the" else 0
        return words, ["O"] * start + [f"{'B' if i == start else 'I'}-{kind}" for i in range(start, len(words))]
    pool = {"NOUN": NOUNS, "VERB": VERBS, "TIME": TIMES, "NUM": NUMBERS}[slot]
    words = rng.choice(pool).split()
    return words, ["O"] * len(words)


def _pattern(rng):
    """One sentence pattern: a whole template, or subject + predicate [+ place] [+ time]."""
    if rng.random() < 0.25:
        return rng.choice(TEMPLATES)
    parts = [rng.choice(SUBJECTS), rng.choice(PREDICATES)]
    if rng.random() < 0.5:
        parts.append(rng.choice(PLACES))
    if rng.random() < 0.5:
        parts.append("{TIME}")
    return " ".join(parts + ["."])


def generate(n, seed=0, held_out=False):
    """`n` tagged sentences [(tokens, tags)]; `held_out` draws entity names from the unseen lists only (no
    made-up names), the others from the training lists and `pseudo_name`."""
    rng = random.Random(seed)
    names = dict(HELD_OUT) if held_out else {"FIRST": FIRST, "LAST": LAST, "LOC": LOC, "ORG": ORG, "MISC": MISC}
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for piece in _pattern(rng).split():
            if piece.startswith("{") and piece.endswith("}"):
                words, labels = _fill(rng, piece[1:-1], names, pseudo=not held_out)
            else:
                words, labels = [piece], ["O"]
            if not tokens and words[0] == "the":  # sentence-initial capital
                words = ["The"] + words[1:]
            tokens += words
            tags += labels
        sentences.append((tokens, tags))
    return sentences


def write_text(path, sentences):
    with open(path, "w", encoding="utf-8") as f:
        for tokens, _ in sentences:
            f.write(" ".join(tokens) + "\n")


def write_conll(path, sentences):
    with open(path, "w", encoding="utf-8") as f:
        for tokens, tags in sentences:
            for token, tag in zip(tokens, tags):
                f.write(f"{token}\t{tag}\n")
            f.write("\n")


def write_demo_data(out_dir, lm_sentences=4000, ner_train=600, ner_dev=100, ner_test=100, seed=0):
    """Writes lm/train.txt, lm/valid.txt and ner/{train,dev,test}.conll under `out_dir`; returns their paths."""
    os.makedirs(os.path.join(out_dir, "lm"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "ner"), exist_ok=True)
    paths = {
        "lm_train": os.path.join(out_dir, "lm", "train.txt"),
        "lm_valid": os.path.join(out_dir, "lm", "valid.txt"),
        "ner_train": os.path.join(out_dir, "ner", "train.conll"),
        "ner_dev": os.path.join(out_dir, "ner", "dev.conll"),
        "ner_test": os.path.join(out_dir, "ner", "test.conll"),
    }
    # the biLM sees seen and unseen names in running text (as a real pretraining corpus would hold them)
    write_text(paths["lm_train"], generate(lm_sentences, seed) + generate(lm_sentences // 4, seed + 1, held_out=True))
    write_text(paths["lm_valid"], generate(200, seed + 2))
    write_conll(paths["ner_train"], generate(ner_train, seed + 3))
    write_conll(paths["ner_dev"], generate(ner_dev, seed + 4))
    write_conll(paths["ner_test"], generate(ner_test, seed + 5, held_out=True))
    return paths
