"""String preprocessing in TF ops: tokenization and the char-id mapping of the original ELMo.

Names are imported on first access (`elmo_tf._lazy`). `chars` and `tokenizer` import TensorFlow only where they build
an op, so their constants (`MAX_CHARS`, `TOKENIZERS`) and Python twins (`split_tokens`) serve code that must not load
it (the command lines' parsers, `elmo_tf.config`, `elmo_tf.io.vocabulary`).
"""

from elmo_tf import _lazy

# public name -> the module it is imported from
_EXPORTS = {
    "BOS_CHAR_IDS": "elmo_tf.preprocessing.chars",
    "add_sentence_boundaries": "elmo_tf.preprocessing.chars",
    "EOS_CHAR_IDS": "elmo_tf.preprocessing.chars",
    "MAX_CHARS": "elmo_tf.preprocessing.chars",
    "NUM_CHAR_IDS": "elmo_tf.preprocessing.chars",
    "token_bytes": "elmo_tf.preprocessing.chars",
    "tokens_to_char_ids": "elmo_tf.preprocessing.chars",
    "tokens_to_char_ids_numpy": "elmo_tf.preprocessing.chars",
    "whitespace_tokenize": "elmo_tf.preprocessing.tokenizer",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS)
