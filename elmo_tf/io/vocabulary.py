"""Word vocabularies for biLM pretraining: one word per line, `<S>`, `</S>`, `<UNK>` first, then by frequency.

The log-uniform (Zipfian) negative sampler of the sampled softmax assumes ids sorted by decreasing
frequency, so the order of the file matters.
"""

import collections
import glob
import os

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)


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
        """Reads one word per line (UTF-8); `<S>`, `</S>`, `<UNK>` are moved to the front if elsewhere."""
        try:
            with open(path, encoding="utf-8") as f:
                words = [line.rstrip("\r\n") for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read vocabulary {path!r}: {e}") from None
        words = [w for w in words if w]
        if not words:
            raise ValueError(f"vocabulary {path!r} is empty")
        rest = [w for w in words if w not in SPECIALS]
        return cls(list(SPECIALS) + rest)

    def save(self, path):
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(self.words) + "\n")
        os.replace(tmp, path)


def expand_glob(pattern):
    """Files matching a glob (sorted); raises ValueError naming the pattern when none match."""
    files = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not files:
        raise ValueError(f"no files match {pattern!r}")
    return files


def count_words(paths, progress=None):
    """Streams the files line by line and counts whitespace tokens (invalid UTF-8 is replaced, not fatal)."""
    counts = collections.Counter()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                counts.update(line.split())
                if progress:
                    progress(1)
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
