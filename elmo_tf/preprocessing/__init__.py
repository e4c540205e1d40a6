"""String preprocessing in TF ops: tokenization and the char-id mapping of the original ELMo.

Names are imported on first access (`elmo_tf._lazy`). `tokenizer` imports TensorFlow only where it builds an op, so
its `TOKENIZERS` and Python twin `split_tokens` serve code that must not load it (the command lines' parsers,
`elmo_tf.io.vocabulary`).
"""

from elmo_tf import _lazy

__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.preprocessing.chars": (
            "BOS_CHAR_IDS",
            "EOS_CHAR_IDS",
            "MAX_CHARS",
            "NUM_CHAR_IDS",
            "add_sentence_boundaries",
            "token_bytes",
            "tokens_to_char_ids",
            "tokens_to_char_ids_numpy",
        ),
        "elmo_tf.preprocessing.tokenizer": ("whitespace_tokenize",),
    },
)
