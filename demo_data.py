"""Demo data that the project writes itself: English-like sentences from a small grammar, with NER tags.

`make demo` must run on a fresh machine with no corpora and no downloads, so it generates its text here:
news-style sentences built from templates, with person, location, organization and miscellaneous names
(PER, LOC, ORG, MISC) filled in from word lists. The same generator writes
  - plain text (one sentence per line, whitespace tokens) for pretraining the biLM, and
  - CoNLL files (token<TAB>tag, IOB2, blank line between sentences) for the NER head.
The test split draws entity names the training split never saw (from `held_out` name lists), so a tagger
only scores on them through context and spelling, which is what ELMo features are for.
Generation is deterministic for a seed. This is a toy corpus for exercising the pipeline, not a benchmark:
use `--data` with real corpora for numbers.
"""

import os
import random

FIRST = [
    "Anna",
    "Maria",
    "John",
    "Peter",
    "Laura",
    "David",
    "Sofia",
    "Ahmed",
    "Mei",
    "Carlos",
    "Elena",
    "Tom",
    "Fatima",
    "Lars",
    "Yuki",
    "Olga",
    "Samuel",
    "Priya",
    "Hans",
    "Grace",
]
LAST = [
    "Smith",
    "Schmidt",
    "Garcia",
    "Rossi",
    "Novak",
    "Tanaka",
    "Okafor",
    "Kowalski",
    "Dubois",
    "Jensen",
    "Silva",
    "Chen",
    "Haddad",
    "Murphy",
    "Ivanova",
    "Berg",
    "Costa",
    "Meyer",
    "Patel",
    "Larsen",
]
LOC = [
    "Berlin",
    "Paris",
    "Madrid",
    "Lisbon",
    "Warsaw",
    "Nairobi",
    "Lima",
    "Oslo",
    "Cairo",
    "Toronto",
    "Vienna",
    "Dublin",
    "Seoul",
    "Jakarta",
    "Chile",
    "Kenya",
    "Norway",
    "Canada",
    "Brazil",
    "Japan",
    "New York",
    "Buenos Aires",
    "South Africa",
    "Hong Kong",
]
ORG = [
    "Siemens",
    "Reuters",
    "Oxfam",
    "Toyota",
    "Nestle",
    "Interpol",
    "UNESCO",
    "Fiat",
    "Nokia",
    "Airbus",
    "Greenpeace",
    "Unilever",
    "the World Bank",
    "the Red Cross",
    "General Motors",
    "Deutsche Bank",
    "the European Union",
    "Real Madrid",
]
MISC = [
    "German",
    "French",
    "Olympic",
    "Japanese",
    "Brazilian",
    "Christian",
    "Kenyan",
    "Canadian",
    "Euro",
    "Nobel",
    "Irish",
    "Korean",
]
HELD_OUT = {
    "FIRST": ["Ingrid", "Kofi", "Lucia", "Ravi", "Nadia", "Felix"],
    "LAST": ["Andersen", "Mensah", "Ferrari", "Sharma", "Popescu", "Weber"],
    "LOC": ["Prague", "Accra", "Manila", "Quito", "Finland", "Morocco", "Cape Town"],
    "ORG": ["Philips", "Samsung", "Heineken", "Amnesty International", "the United Nations"],
    "MISC": ["Dutch", "Italian", "Swedish", "Mexican"],
}
NOUNS = [
    "talks",
    "agreement",
    "report",
    "plan",
    "deal",
    "election",
    "match",
    "contract",
    "strike",
    "merger",
    "budget",
    "summit",
    "project",
    "investigation",
    "festival",
]
VERBS = [
    "announced",
    "criticized",
    "welcomed",
    "rejected",
    "signed",
    "discussed",
    "postponed",
    "praised",
    "questioned",
    "supported",
]
TIMES = ["on Monday", "on Tuesday", "last week", "in March", "this year", "on Friday", "in 2019", "yesterday"]
NUMBERS = ["two", "three", "five", "12", "40", "several", "hundreds of", "1,200"]

# {X} slots: PER (full name), FIRST, LAST, LOC, ORG, MISC, NOUN, VERB, TIME, NUM
TEMPLATES = [
    "{PER} {VERB} the {NOUN} with {ORG} in {LOC} {TIME} .",
    "{ORG} {VERB} the {MISC} {NOUN} {TIME} , a spokesman said .",
    "{PER} , who works for {ORG} , arrived in {LOC} {TIME} .",
    "The {MISC} government {VERB} the {NOUN} proposed by {PER} .",
    "{NUM} people attended the {NOUN} in {LOC} {TIME} .",
    "Officials in {LOC} said {ORG} had {VERB} the {NOUN} .",
    "{LAST} told reporters in {LOC} that the {NOUN} would continue .",
    "Shares of {ORG} rose after the company {VERB} a {NOUN} with {ORG} .",
    "{PER} and {PER} {VERB} the {MISC} {NOUN} {TIME} .",
    "The {NOUN} between {LOC} and {LOC} was {VERB} by {ORG} .",
    "{FIRST} said the {NOUN} was good news for {LOC} .",
    "According to {ORG} , {NUM} {MISC} workers joined the {NOUN} .",
    "{PER} won the {MISC} {NOUN} in {LOC} {TIME} .",
    "It was not clear whether {ORG} {VERB} the {NOUN} .",
    "The {NOUN} {VERB} {TIME} was the first since {NUM} years ago .",
    "{LAST} , the head of {ORG} , {VERB} the {NOUN} in {LOC} .",
]


def _fill(rng, slot, names):
    """(tokens, tags) for one slot."""
    if slot == "PER":
        first, last = rng.choice(names["FIRST"]), rng.choice(names["LAST"])
        return [first, last], ["B-PER", "I-PER"]
    if slot in ("FIRST", "LAST"):
        return [rng.choice(names[slot])], ["B-PER"]
    if slot in ("LOC", "ORG", "MISC"):
        words = rng.choice(names[slot]).split()
        tags = [
            "O" if w == "the" and i == 0 else f"{'B' if i == (1 if words[0] == 'the' else 0) else 'I'}-{slot}"
            for i, w in enumerate(words)
        ]
        return words, tags
    pool = {"NOUN": NOUNS, "VERB": VERBS, "TIME": TIMES, "NUM": NUMBERS}[slot]
    words = rng.choice(pool).split()
    return words, ["O"] * len(words)


def generate(n, seed=0, held_out=False):
    """`n` tagged sentences [(tokens, tags)]; `held_out` draws entity names from the unseen lists."""
    rng = random.Random(seed)
    names = {"FIRST": FIRST, "LAST": LAST, "LOC": LOC, "ORG": ORG, "MISC": MISC}
    if held_out:
        names = dict(HELD_OUT)
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for piece in rng.choice(TEMPLATES).split():
            if piece.startswith("{") and piece.endswith("}"):
                words, labels = _fill(rng, piece[1:-1], names)
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


def write_demo_data(out_dir, lm_sentences=4000, ner_train=400, ner_dev=100, ner_test=100, seed=0):
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
