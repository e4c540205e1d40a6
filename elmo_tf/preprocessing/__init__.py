"""String preprocessing in TF ops: tokenization and the char-id mapping of the original ELMo."""

from elmo_tf.preprocessing.chars import (
    BOS_CHAR_IDS,
    EOS_CHAR_IDS,
    MAX_CHARS,
    NUM_CHAR_IDS,
    add_sentence_boundaries,
    token_bytes,
    tokens_to_char_ids,
    tokens_to_char_ids_numpy,
)
from elmo_tf.preprocessing.tokenizer import whitespace_tokenize

__all__ = [
    "BOS_CHAR_IDS",
    "add_sentence_boundaries",
    "EOS_CHAR_IDS",
    "MAX_CHARS",
    "NUM_CHAR_IDS",
    "token_bytes",
    "tokens_to_char_ids",
    "tokens_to_char_ids_numpy",
    "whitespace_tokenize",
]
