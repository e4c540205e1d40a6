"""A model's char mapping without TensorFlow: its sizes, special ids and boundary rows, and tokens -> ids in NumPy.

What a model needs of its mapping to run (`ELMo` puts `bos_row` / `eos_row` around every sentence) and what turns
Python strings into its ids on any Keras backend, TensorFlow installed or not: bilm-tf's UTF-8 bytes
(`BYTE_MAPPING`) or an ELMoForManyLangs char vocabulary (`VocabularyRows`). `elmo_tf.preprocessing.char_vocabulary`
holds the TensorFlow twin, the lookup tables a SavedModel carries, and builds its rows with `VocabularyRows`;
`char_mapping(config)` picks the one of the running Keras backend.
"""

import numpy as np

from elmo_tf.preprocessing.chars import BOS_CHAR_IDS, BOW, EOS_CHAR_IDS, EOW, MAX_CHARS, PAD, tokens_to_char_ids_numpy

CHAR_SPECIALS = ("bow", "eow", "pad", "oov", "bos", "eos")
WORD_SPECIALS = ("oov", "bos", "eos")
BOS_TOKEN = "<bos>"  # ELMoForManyLangs' sentence boundary tokens (also how a literal token "<bos>" maps)
EOS_TOKEN = "<eos>"


class ByteCharMapping:
    """bilm-tf / AllenNLP's mapping (UTF-8 bytes, `elmo_tf.preprocessing.chars`) behind the interface of
    `VocabularyCharMapping`."""

    width = MAX_CHARS
    pad_id = PAD
    bos_row, eos_row = BOS_CHAR_IDS, EOS_CHAR_IDS
    empty_row = np.array([BOW, EOW] + [PAD] * (MAX_CHARS - 2), np.int32)  # "" as a token (AllenNLP's mapping)

    def __call__(self, tokens):
        from elmo_tf.preprocessing.chars import tokens_to_char_ids

        return tokens_to_char_ids(tokens)

    def numpy(self, tokens):
        return tokens_to_char_ids_numpy(tokens)


BYTE_MAPPING = ByteCharMapping()


def _as_text(token):
    """A token (str or bytes) as the code points ELMoForManyLangs' mapping reads: bytes decoded as UTF-8, each invalid
    sequence one U+FFFD (TensorFlow's `unicode_split(errors="replace")`); str as it is, a lone surrogate (an invalid
    byte kept by `errors="surrogateescape"`) as U+FFFD too."""
    raw = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else bytes(token)
    return raw.decode("utf-8", "replace")


class VocabularyRows:
    """An ELMoForManyLangs char mapping in NumPy: code points looked up in a char vocabulary, optionally with a word
    id column (the arguments and the rows are `VocabularyCharMapping`'s, which builds its rows with this class).

    Args:
        char_vocabulary: `(entry, id)` pairs; single-code-point entries are what tokens' chars match.
        special_ids: dict with the ids (before the +1 shift) of each of `CHAR_SPECIALS`.
        word_vocabulary: `(entry, id)` pairs, or None for no word column.
        word_special_ids: dict with the word ids of `WORD_SPECIALS` (with `word_vocabulary`).
        max_chars: row length (50).
    """

    def __init__(self, char_vocabulary, special_ids, word_vocabulary=None, word_special_ids=None, max_chars=MAX_CHARS):
        self.special = {k: int(special_ids[k]) + 1 for k in CHAR_SPECIALS}
        self.max_chars = max_chars
        self.width = max_chars + (1 if word_vocabulary is not None else 0)
        self.pad_id = self.special["pad"]
        self.char_ids = {entry: int(i) for entry, i in char_vocabulary}
        self.oov = int(special_ids["oov"])
        self.word_ids = None
        if word_vocabulary is not None:
            self.word_special = {k: int(word_special_ids[k]) + 1 for k in WORD_SPECIALS}
            self.word_ids = {entry: int(i) for entry, i in word_vocabulary}
            self.word_oov = int(word_special_ids["oov"])
        self.bos_row = self.row([self.special["bos"]], self.word_special["bos"] if self.word_ids is not None else None)
        self.eos_row = self.row([self.special["eos"]], self.word_special["eos"] if self.word_ids is not None else None)
        self.empty_row = self.row([])

    def row(self, chars, word=None):
        """`[bow, chars..., eow, pad, ...]` (shifted ids), then the word id column if any (`oov` when None)."""
        s = self.special
        row = [s["bow"], *chars, s["eow"]] + [s["pad"]] * (self.max_chars - 2 - len(chars))
        if self.word_ids is not None:
            row.append(self.word_special["oov"] if word is None else word)
        return np.array(row, np.int32)

    def numpy(self, tokens):
        """A list of `str`/`bytes` tokens -> int32 `(n, width)`; "" gives an all-zero row."""
        out = np.zeros([len(tokens), self.width], np.int32)
        for k, token in enumerate(tokens):
            text = _as_text(token)
            if text == "":
                continue
            if text in (BOS_TOKEN, EOS_TOKEN):
                out[k] = self.bos_row if text == BOS_TOKEN else self.eos_row
                continue
            chars = text[: self.max_chars - 2]
            word = None
            if self.word_ids is not None:
                word = self.word_ids.get(chars, self.word_oov) + 1
            out[k] = self.row([self.char_ids.get(c, self.oov) + 1 for c in chars], word)
        return out

    __call__ = numpy


def vocabulary_arguments(config):
    """The arguments of `VocabularyRows` (and of TensorFlow's `VocabularyCharMapping`) for a `BiLMConfig` with a char
    vocabulary: `(char_vocabulary, special_ids, word_vocabulary, word_special_ids, max_chars)`."""
    return (
        config.char_vocabulary,
        dict(config.char_special_ids),
        config.word_vocabulary,
        dict(config.word_special_ids) if config.word_special_ids else None,
        config.max_characters_per_token,
    )


def sentences_to_char_ids(mapping, sentences):
    """Sentences of Python strings (lists of `str`/`bytes` of any lengths, "" as padding, dropped) -> int32 NumPy
    `(batch, longest, mapping.width)`, all-zero rows past each sentence: what a model takes off TensorFlow."""
    sentences = [[t for t in sentence if len(t)] for sentence in sentences]
    ids = np.zeros([len(sentences), max(map(len, sentences), default=0), mapping.width], np.int32)
    for k, sentence in enumerate(sentences):
        if sentence:
            ids[k, : len(sentence)] = mapping.numpy(sentence)
    return ids
