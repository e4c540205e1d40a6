"""Full-softmax perplexity of a biLM with a softmax (`BiLMPretrainer`, `LanguageModel`) over text files."""

import math

import tensorflow as tf

from elmo_tf.models.language_model import DEFAULT_CHUNK_SIZE, sentence_log_probs
from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table


def evaluate_perplexity(
    model, vocab, files, batch_size=64, max_tokens=50, progress=None, chunk_size=DEFAULT_CHUNK_SIZE
):
    """Full-softmax perplexity over `files`: dict with forward, backward, average (exp of the mean of the
    two mean NLLs), tokens (targets counted: words plus `</S>` forward, `<S>` backward).

    The log-probabilities are `elmo_tf.models.language_model.sentence_log_probs`'s, the code path of
    `LanguageModel` and `elmo-tf score`: a sentence's perplexity here is the exp of minus the mean of its
    `forward_log_probs` (or `backward_log_probs`) there. Unknown words count as `vocab.unk_id`. Tokens are mapped
    to char ids by the model's own `char_mapping`."""
    table = vocabulary_table(vocab.words, unk_id=getattr(vocab, "unk_id", 2))
    mapping = model.char_mapping
    ds = lm_dataset(
        files, table, batch_size, max_tokens=max_tokens, shuffle_buffer=0, repeat=False, char_mapping=mapping
    )
    char_spec = tf.TensorSpec([None, None, mapping.width], tf.int32)

    @tf.function(
        input_signature=[{"char_ids": char_spec, "token_ids": tf.TensorSpec([None, None], tf.int32)}], autograph=False
    )
    def step(batch):
        out = sentence_log_probs(model, batch, chunk_size=chunk_size)
        count = tf.reduce_sum(out["sequence_len"] + 1)
        return -tf.reduce_sum(out["forward_log_probs"]), -tf.reduce_sum(out["backward_log_probs"]), count

    fwd = bwd = count = 0.0
    for batch in ds:
        f, b, n = step(batch)
        fwd, bwd, count = fwd + float(f), bwd + float(b), count + float(n)
        if progress:
            progress(int(batch["token_ids"].shape[0]))
    if count == 0:
        raise ValueError(f"no tokens to evaluate in {files}")
    return {
        "forward": math.exp(fwd / count),
        "backward": math.exp(bwd / count),
        "average": math.exp(0.5 * (fwd + bwd) / count),
        "tokens": int(count),
    }
