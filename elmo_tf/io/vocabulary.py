"""Word vocabularies for biLM pretraining: one word per line, `<S>`, `</S>`, `<UNK>` first, then by frequency.

The log-uniform (Zipfian) negative sampler of the sampled softmax assumes ids sorted by decreasing
frequency, so the order of the file matters.
"""

import collections
import glob
import logging
import os

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import write_text
from elmo_tf.io.text import TextFileError, decode_line, iter_lines, raw_lines
from elmo_tf.preprocessing.tokenizer import split_tokens

logger = logging.getLogger(__name__)

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)


class VocabularyError(ElmoTFError):
    """A vocabulary file that cannot be used; the message names the file and, where it applies, the line."""


class CorpusError(ElmoTFError):
    """A corpus file that is not text (UTF-16, binary, a directory); the message names the file and line."""


class Vocabulary:
    """Word <-> id over a fixed word list (ids are line numbers of the vocabulary file).

    Args:
        words: list of words; must start with `<S>`, `</S>`, `<UNK>` (in that order).
    """

    def __init__(self, words):
        words = list(words)
        if tuple(words[:3]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {list(SPECIALS)}, got {words[:3]}")
        if len(set(words)) != len(words):
            dup = next(w for w, n in collections.Counter(words).items() if n > 1)
            raise ValueError(f"vocabulary has duplicate word {dup!r}")
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}

    def __len__(self):
        return len(self.words)

    bos_id, eos_id, unk_id = 0, 1, 2

    def word_to_id(self, word):
        return self.index.get(word, self.unk_id)

    @classmethod
    def load(cls, path):
        """Reads one word per line (UTF-8); `<S>`, `</S>`, `<UNK>` are moved to the front if elsewhere.

        Raises:
            VocabularyError: a missing file or a directory, invalid UTF-8, a UTF-16 or binary file, an empty
                file, a word listed twice (the message names the file and the lines).
        """
        words, lines = [], {}
        try:
            for number, word in iter_lines(path):
                if not word:
                    continue
                if word in lines:
                    raise VocabularyError(f"{path}:{number}: duplicate word {word!r} (first on line {lines[word]})")
                lines[word] = number
                words.append(word)
        except TextFileError as e:
            raise VocabularyError(f"cannot read vocabulary {e}") from None
        if not words:
            raise VocabularyError(f"{path}: the vocabulary is empty (expected one word per line)")
        rest = [w for w in words if w not in SPECIALS]
        return cls(list(SPECIALS) + rest)

    def save(self, path):
        """Writes one word per line (UTF-8), atomically: `path` holds the old file or the whole new one."""
        write_text(path, "\n".join(self.words) + "\n")


def expand_glob(pattern):
    """Files matching a glob (sorted); raises ValueError naming the pattern when none match."""
    files = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not files:
        if os.path.isdir(pattern):
            raise ValueError(
                f"{pattern!r} is a directory: give a glob of its files, e.g. {os.path.join(pattern, '*.txt')!r}"
            )
        raise ValueError(f"no files match {pattern!r}")
    return files


def count_words(paths, progress=None):
    """Streams the files line by line and counts whitespace tokens.

    Invalid UTF-8 is replaced by U+FFFD, not fatal (a warning names the first such line of each file); a UTF-8
    byte order mark is skipped. Raises `CorpusError` naming the file and line for a file that is not text
    (UTF-16/UTF-32, NUL bytes), a missing file or a directory.
    """
    counts = collections.Counter()
    for path in paths:
        invalid, first_invalid = 0, None
        try:
            for number, offset, line in raw_lines(path):
                try:
                    text = decode_line(path, number, offset, line)
                except TextFileError as e:
                    invalid += 1
                    first_invalid = first_invalid or str(e)
                    text = line.decode("utf-8", "replace")
                counts.update(split_tokens(text))  # the tokens lm_dataset's tf.strings.split sees
                if progress:
                    progress(1)
        except TextFileError as e:
            raise CorpusError(str(e)) from None
        if invalid:
            logger.warning("invalid UTF-8 on %d line(s), replaced by U+FFFD; the first: %s", invalid, first_invalid)
    return counts


def build_vocabulary(counts, min_count=1, max_size=None):
    """Specials first, then words by decreasing count (ties by word), keeping count >= min_count and at
    most `max_size` entries in all (specials included)."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if max_size is not None and max_size <= len(SPECIALS):
        raise ValueError(f"max_size must be > {len(SPECIALS)} (the special tokens), got {max_size}")
    ranked = sorted(
        ((w, n) for w, n in counts.items() if n >= min_count and w not in SPECIALS),
        key=lambda item: (-item[1], item[0]),
    )
    words = list(SPECIALS) + [w for w, _ in ranked]
    return Vocabulary(words[:max_size] if max_size else words)
