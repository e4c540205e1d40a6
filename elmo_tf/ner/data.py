"""NER data: reading the train/dev/test files, the label map and word vocabulary (`Encoder`), tag schemes."""

import collections
import json

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import write_json
from elmo_tf.io.conll import ConllFormatError, read_conll
from elmo_tf.ner.featurizer import NERFeaturizer, lowercase_words
from elmo_tf.ner.tags import SCHEMES, convert, entity_type, labels_for, spans

SPLITS = ("train", "dev", "test")


class NERDataError(ElmoTFError):
    """NER data that cannot be used; the message names the split's file (and line, for format errors)."""

    def __init__(self, split, message):
        super().__init__(message)
        self.split = split


def detect_scheme(path):
    """The tag scheme of a CoNLL file: "iob1" when its first token line has 4 or more columns (CoNLL-2003),
    else "iob2" (WNUT-17)."""
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConllFormatError(f"cannot read {path!r}: {e.strerror}") from None
    with f:
        for line in f:
            if line.strip() and not line.startswith("-DOCSTART-"):
                return "iob1" if len(line.split()) >= 4 else "iob2"
    return "iob2"


class Encoder:
    """Label map, word vocabulary (from training sentences) and scheme conversion for one tagger.

    Args:
        labels: the CRF's tag strings in `scheme` (ids are positions; "O" first).
        scheme: the scheme the CRF works in.
        words: the word vocabulary, lowercased by `elmo_tf.ner.featurizer.lowercase` (word ids 2, 3, ...).
        source_scheme: the scheme of the data files (tags are converted from it and back to it).
    """

    def __init__(self, labels, scheme, words=None, source_scheme=None):
        self.labels = list(labels)
        self.scheme = scheme
        self.source_scheme = source_scheme or scheme
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.words = list(words or [])

    @classmethod
    def fit(cls, sentences, source_scheme, scheme="bioes", min_word_count=2):
        """Every tag of `scheme` for the entity types of `sentences` (`elmo_tf.ner.tags.labels_for`: all forms of a
        type, seen or not), and the lowercased words seen `min_word_count` times."""
        types = {kind for s in sentences for kind, _, _ in spans(s.tags, source_scheme)}
        counts = collections.Counter(lowercase_words([w for s in sentences for w in s.tokens]))
        words = sorted(w for w, n in counts.items() if n >= min_word_count)
        return cls(labels_for(types, scheme), scheme, words, source_scheme)

    def entity_types(self):
        """The entity types of the labels, sorted."""
        return sorted({entity_type(label) for label in self.labels} - {None})

    def featurizer(self, use_words=True, use_chars=True):
        """The `NERFeaturizer` of a tagger trained with this encoder."""
        return NERFeaturizer(self.words if use_words else None, use_chars=use_chars)

    def featurizer_for(self, tagger):
        """The `NERFeaturizer` giving exactly the inputs `tagger` (an `NERTagger`) takes."""
        return self.featurizer(tagger.word_vocab_size > 0, bool(tagger.char_filters))

    def word_vocab_size(self, use_words=True):
        """Rows of the tagger's word embedding (padding and unknown included); 0 without word features."""
        return len(self.words) + 2 if use_words else 0

    def encode_tags(self, tags):
        """Label ids of a sentence's tags (the source scheme).

        Raises:
            ValueError: a tag of an entity type without labels (never seen in training), naming the tag and the
                types there are; or, with an encoder.json written before every form of a type was a label, a form
                the labels lack.
        """
        converted = convert(tags, self.source_scheme, self.scheme)
        for tag, label in zip(tags, converted):
            if label not in self.label_ids:
                types = self.entity_types()
                kind = entity_type(label)
                what = (
                    f"entity type {kind!r} (tag {tag!r})"
                    if kind not in types
                    else f"tag {tag!r} ({self.scheme} {label!r})"
                )
                raise ValueError(
                    f"{what} never appears in the training data (entity types there: {', '.join(types) or 'none'})"
                )
        return [self.label_ids[t] for t in converted]

    def decode_tags(self, ids):
        return convert([self.labels[i] for i in ids], self.scheme, self.source_scheme)

    def to_json(self):
        return {"labels": self.labels, "scheme": self.scheme, "source_scheme": self.source_scheme, "words": self.words}

    @classmethod
    def from_json(cls, data):
        return cls(data["labels"], data["scheme"], data["words"], data["source_scheme"])

    def save(self, path):
        write_json(path, self.to_json(), indent=None)

    @classmethod
    def load(cls, path):
        """Reads an encoder.json; raises ValueError naming the file when it is not one."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            return cls.from_json(data)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not an encoder.json written by train_ner.py ({type(e).__name__}: {e})") from None


def read_splits(paths, tag_scheme="auto", crf_scheme="bioes", max_sentences=0):
    """Reads the NER files and fits the label map on train.

    Args:
        paths: `{split: path}` with "train" and "dev" (and optionally "test"); None paths are skipped.
        tag_scheme: the files' scheme, or "auto" (`detect_scheme` of the train file).
        crf_scheme: the scheme the CRF works in ("iob2" or "bioes").
        max_sentences: use only the first N sentences of each file (0: all).
    Returns:
        (files' scheme, {split: list of `Sentence`}, `Encoder`).
    Raises:
        NERDataError: a file that cannot be read or parsed (naming file and line), or a dev/test tag of an entity type
            train lacks; `.split` names the split.
    """
    if tag_scheme != "auto" and tag_scheme not in SCHEMES:
        raise ValueError(f"tag_scheme must be 'auto' or one of {SCHEMES}, got {tag_scheme!r}")
    splits = {}
    for name in SPLITS:
        if paths.get(name):
            try:
                splits[name] = read_conll(paths[name])
            except ConllFormatError as e:
                raise NERDataError(name, str(e)) from None
    scheme = detect_scheme(paths["train"]) if tag_scheme == "auto" else tag_scheme
    cut = max_sentences and len(splits["train"]) > max_sentences
    if max_sentences:
        splits = {k: v[:max_sentences] for k, v in splits.items()}
    encoder = Encoder.fit(splits["train"], scheme, crf_scheme)
    for name, sentences in splits.items():  # an entity type train lacks: a clear error now, not mid-training
        for s in sentences:
            try:
                encoder.encode_tags(s.tags)
            except ValueError as e:
                hint = (
                    f"; --max-sentences {max_sentences} kept only the first {max_sentences} training sentences"
                    if cut
                    else ""
                )
                raise NERDataError(name, f"{paths[name]}:{s.line}: {e}{hint if cut else ''}") from None
    return scheme, splits, encoder
