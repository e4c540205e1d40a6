"""Full-softmax perplexity of a `BiLMPretrainer` over text files."""

import math

import tensorflow as tf

from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table


def evaluate_perplexity(model, vocab, files, batch_size=64, max_tokens=50, progress=None):
    """Full-softmax perplexity over `files`: dict with forward, backward, average (exp of the mean of the
    two mean NLLs), tokens (targets counted: words plus `</S>` forward, `<S>` backward)."""
    table = vocabulary_table(vocab.words)
    mapping = model.char_mapping
    ds = lm_dataset(
        files, table, batch_size, max_tokens=max_tokens, shuffle_buffer=0, repeat=False, char_mapping=mapping
    )
    char_spec = tf.TensorSpec([None, None, mapping.width], tf.int32)

    @tf.function(input_signature=[{"char_ids": char_spec, "token_ids": tf.TensorSpec([None, None], tf.int32)}])
    def step(batch):
        return model.losses_sum(batch, training=False, sampled=False)

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
