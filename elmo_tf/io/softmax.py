"""The files of a biLM's language-model head: the softmax (`softmax.hdf5`, the layout of the released
`*_softmax_weights.hdf5`) and its vocabulary (one word per line, row j of the softmax = line j + 1).

Layout of the softmax file:
    softmax/W   (V, P)   one row per vocabulary word, P = the biLM's projection_dim
    softmax/b   (V,)
bilm-tf's vocabularies (the released `vocab-2016-09-10.txt`, and elmo_tf's `vocab.txt`) hold `<S>`, `</S>` and `<UNK>`
somewhere (bilm-tf looks them up by name), each word on its own line; the softmax's rows follow the lines.
"""

import numpy as np

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.bilm_hdf5 import WeightFileError, open_hdf5
from elmo_tf.io.text import TextFileError, iter_lines

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SOFTMAX_WEIGHTS, SOFTMAX_BIAS = "softmax/W", "softmax/b"
_ROWS_PER_READ = 1 << 16  # rows read and checked at a time: 128 MiB of float32 at P = 512


class LMVocabularyError(ElmoTFError):
    """A vocabulary that cannot go with a softmax: unreadable, a blank line, a word twice, or no `<S>`, `</S>` or
    `<UNK>`. The message names the file (and the line)."""


class LMVocabulary:
    """The words of a language model's softmax, in file order, and the ids of its special words.

    Args:
        words: the V words, row j of the softmax = words[j]; `<S>`, `</S>` and `<UNK>` among them.
        path: the file they came from (named by errors), or None.
    Attributes:
        words, index (word -> id), bos_id, eos_id, unk_id.
    """

    def __init__(self, words, path=None):
        self.words = list(words)
        self.path = path
        self.index = {w: i for i, w in enumerate(self.words)}
        where = path or "the vocabulary"
        if len(self.index) != len(self.words):
            raise LMVocabularyError(f"{where}: a word is listed twice", path=path)
        missing = [w for w in (BOS, EOS, UNK) if w not in self.index]
        if missing:
            raise LMVocabularyError(
                f"{where}: has no {', '.join(missing)} (a language model's vocabulary holds <S>, </S> and <UNK>)",
                path=path,
            )
        self.bos_id, self.eos_id, self.unk_id = (self.index[w] for w in (BOS, EOS, UNK))

    def __len__(self):
        return len(self.words)

    @classmethod
    def load(cls, path):
        """Reads one word per line (UTF-8) and keeps the file's order: word j is row j of the softmax.

        Raises:
            LMVocabularyError: a missing, UTF-16 or binary file, invalid UTF-8, a blank line, a word twice, or no
                `<S>`, `</S>` or `<UNK>` (the message names the file and the line).
        """
        words, lines = [], {}
        try:
            for number, word in iter_lines(path):
                word = word.strip()
                if not word:
                    raise LMVocabularyError(
                        f"{path}:{number}: blank line (each line is one word, its line the softmax row)",
                        path=path,
                        line=number,
                    )
                if word in lines:
                    raise LMVocabularyError(
                        f"{path}:{number}: duplicate word {word!r} (first on line {lines[word]})",
                        path=path,
                        line=number,
                    )
                lines[word] = number
                words.append(word)
        except TextFileError as e:
            raise LMVocabularyError(f"cannot read vocabulary {e}", path=path) from None
        if not words:
            raise LMVocabularyError(f"{path}: the vocabulary is empty (expected one word per line)", path=path)
        return cls(words, path)


def softmax_shapes(path):
    """`((V, P), (V,))` as the softmax file at `path` declares them, read without loading the arrays.

    Raises:
        WeightFileError: not HDF5, a file that points outside itself (`elmo_tf.io.hdf5_safety`), a missing dataset,
            a dataset of another rank or of strings, or W and b of different row counts (the message names the file
            and the dataset).
    """
    with open_hdf5(path, what="softmax file") as f:
        shapes = {}
        for name, rank in ((SOFTMAX_WEIGHTS, 2), (SOFTMAX_BIAS, 1)):
            obj = f.get(name)
            if obj is None or not hasattr(obj, "shape"):
                raise WeightFileError(f"{path}: has no dataset {name!r} (a softmax file holds softmax/W and softmax/b)")
            if len(obj.shape) != rank or obj.dtype.kind not in "fiu":
                raise WeightFileError(
                    f"{path}: dataset {name!r} is {obj.dtype} {obj.shape}, expected rank-{rank} floating-point numbers"
                )
            shapes[name] = tuple(obj.shape)
    if shapes[SOFTMAX_BIAS][0] != shapes[SOFTMAX_WEIGHTS][0]:
        raise WeightFileError(
            f"{path}: softmax/b has {shapes[SOFTMAX_BIAS][0]} rows, softmax/W {shapes[SOFTMAX_WEIGHTS][0]}"
        )
    return shapes[SOFTMAX_WEIGHTS], shapes[SOFTMAX_BIAS]


def check_softmax(path, vocab_size, projection_dim, vocab_path=None):
    """Raises `WeightFileError` naming `path` unless its softmax is `(vocab_size, projection_dim)` (from the
    vocabulary at `vocab_path` and the biLM's options)."""
    (rows, width), _ = softmax_shapes(path)
    if rows != vocab_size:
        of = f" of {vocab_path}" if vocab_path else ""
        raise WeightFileError(
            f"{path}: softmax/W has {rows} rows, the vocabulary{of} {vocab_size} words (one row per word)"
        )
    if width != projection_dim:
        raise WeightFileError(
            f"{path}: softmax/W is {width} wide, the biLM's projection_dim is {projection_dim} (from its options)"
        )


def load_softmax_weights(path, kernel, bias):
    """Assigns softmax/W and softmax/b of `path` to the variables `kernel` `(V, P)` and `bias` `(V,)`, a block of
    rows at a time (memory: one block beside the variables, not a second copy of an 800k-word softmax).

    Raises:
        WeightFileError: shapes that differ from the variables', NaN or inf values (the variables may then hold part
            of the file: load into a fresh model).
    """
    check_softmax(path, int(kernel.shape[0]), int(kernel.shape[1]))
    with open_hdf5(path, what="softmax file") as f:
        for name, var in ((SOFTMAX_WEIGHTS, kernel), (SOFTMAX_BIAS, bias)):
            data, rows = f[name], int(var.shape[0])
            for start in range(0, rows, _ROWS_PER_READ):
                block = np.asarray(data[start : start + _ROWS_PER_READ], np.float32)
                if not np.all(np.isfinite(block)):
                    raise WeightFileError(f"{path}: dataset {name!r} holds NaN or inf values")
                if start == 0 and start + len(block) == rows:
                    var.assign(block)
                else:
                    var.value[start : start + len(block)].assign(block)
