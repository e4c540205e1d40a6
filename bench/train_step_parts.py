"""The parts of one biLM training step timed one at a time, on one batch of median length (bench/train_throughput.py
--profile): the input pipeline, the char CNN, each LSTM layer (both directions; the hand-written backward pass and
TF's automatic one), the sampled softmax of both directions, the optimizer update, the whole step; each forward +
backward, in milliseconds (median of `repeats`) with GFLOP/s. Runs with this checkout's `elmo_tf` only."""

import time

from bilm_trainer import flops_per_target
from common import model_flops


def sync(result):
    """`result`'s tensors as NumPy (waits for them); RuntimeError when a gradient is None, since a part without all
    its gradients would time less than its work."""
    import tensorflow as tf

    flat = tf.nest.flatten(result, expand_composites=True)
    if any(t is None for t in flat):
        raise RuntimeError("a profiled part returned a None gradient")
    return [t.numpy() for t in flat]


def timed(fn, *inputs, repeats):
    """Milliseconds of `fn(*inputs)`: the median of `repeats` runs after an untimed one."""
    sync(fn(*inputs))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(fn(*inputs))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1000


def median_batch(trainer, vocab, corpus, batch_size, max_tokens, count):
    """`count` batches of the trainer's pipeline on `corpus`: the one of median length, and the input pipeline's
    milliseconds per batch."""
    from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table

    ds = lm_dataset(
        [corpus],
        vocabulary_table(vocab.words),
        batch_size,
        max_tokens=max_tokens,
        shuffle_buffer=1000,
        bucket_width=trainer.config.bucket_width,
    )
    it = iter(ds)
    t0 = time.perf_counter()
    batches = [next(it) for _ in range(count)]
    input_ms = (time.perf_counter() - t0) * 1000 / len(batches)
    batches.sort(key=lambda b: int(b["token_ids"].shape[1]))
    return batches[len(batches) // 2], input_ms


def char_cnn_part(model, batch, positions, flop, repeats):
    """The char CNN's forward + backward on the distinct tokens of the batch's `positions` (as the step runs it)."""
    import tensorflow as tf

    from elmo_tf.preprocessing.chars import add_sentence_boundaries

    chars = add_sentence_boundaries(batch["char_ids"])
    cnn_vars = model.char_cnn.trainable_variables
    distinct = int(tf.shape(tf.raw_ops.UniqueV2(x=tf.reshape(chars, [-1, 50]), axis=tf.constant([0], tf.int64))[0])[0])

    @tf.function
    def char_cnn(chars):
        with tf.GradientTape() as tape:
            encode = getattr(model.char_cnn, "encode_distinct", None)
            out = encode(chars) if encode is not None else model.char_cnn(chars)
        return tape.gradient(out, cnn_vars)

    return {
        "part": f"char CNN ({distinct} distinct of {positions} tokens)",
        "ms": timed(char_cnn, chars, repeats=repeats),
        "flop": 3 * flop * distinct,
    }


def lstm_part(lstms, scan, mask, units, proj, matmul_dtype):
    """One layer's forward + backward, both directions, with the gradients of its weights and input (`scan` None:
    TF's automatic backward pass). Built in a closure: variables passed to a `tf.function` as default arguments are
    not the ones the tape watches, so their gradients came back None and the weight-gradient matmuls were pruned
    from the timing."""
    import tensorflow as tf

    from elmo_tf.layers.backends.tensorflow_recurrence import projected_lstm_scan, stack_directions

    lstm_vars = [v for lstm in lstms for v in lstm.trainable_variables]
    rows = mask.shape[1]

    @tf.function
    def lstm_step(x):
        zeros = [tf.zeros([rows, units]), tf.zeros([rows, units])], [tf.zeros([rows, proj])] * 2
        with tf.GradientTape() as tape:
            tape.watch(x)
            w_x, b, w_h, w_p = zip(*(lstm.kernels() for lstm in lstms))
            scan_args = (2 * [x], mask, list(w_x), list(b), list(w_h), list(w_p), *zeros, 3.0, 3.0)
            if scan is None:
                outs, _, _ = projected_lstm_scan(*scan_args, stack_directions=stack_directions(units, proj))
            else:
                outs, _, _ = scan(*scan_args, matmul_dtype=matmul_dtype)
            loss = tf.reduce_sum(outs[0]) + tf.reduce_sum(outs[1])
        return tape.gradient(loss, lstm_vars + [x])

    return lstm_step


def lstm_parts(model, rows, length, flop, repeats):
    """Each LSTM layer, both directions, with the hand-written backward pass (the step's) and TF's automatic one."""
    import tensorflow as tf

    from elmo_tf.layers.backends.tensorflow_recurrence import fast_gradient_scan

    bilm = model.bilm
    x = tf.random.normal([length + 2, rows, bilm.projection_dim], stddev=0.5)
    mask = tf.ones([length + 2, rows], tf.bool)
    matmul_dtype = getattr(model, "matmul_dtype", None)  # the parts run their matmuls as the step does
    parts = []
    for layer in range(bilm.num_layers):
        lstms = [bilm.get_lstm(d, layer) for d in ("forward", "backward")]
        for name, scan in (("hand-written backward", fast_gradient_scan), ("TF automatic backward", None)):
            lstm_step = lstm_part(lstms, scan, mask, bilm.units, bilm.projection_dim, matmul_dtype)
            parts.append(
                {
                    "part": f"LSTM layer {layer}, both directions ({name})",
                    "ms": timed(lstm_step, x, repeats=repeats),
                    "flop": 3 * flop * rows * (length + 2),
                    "in_step": scan is not None,
                }
            )
    return parts


def softmax_part(model, targets, flop, repeats):
    """The sampled softmax of both directions on `targets` random states, with its gradients."""
    import tensorflow as tf

    from elmo_tf.models.bilm_pretrainer import sampled_softmax_loss

    states = tf.random.normal([targets, model.bilm.projection_dim], stddev=0.3)
    labels = tf.random.uniform([targets, 1], 0, model.vocab_size, tf.int64)

    @tf.function
    def softmax(states):
        with tf.GradientTape() as tape:
            tape.watch(states)
            loss = 0.0
            for _ in range(2):  # forward and backward LMs
                loss += tf.reduce_sum(
                    sampled_softmax_loss(
                        weights=model.softmax_kernel.value,
                        biases=model.softmax_bias.value,
                        labels=labels,
                        inputs=states,
                        num_sampled=model.num_sampled,
                        num_classes=model.vocab_size,
                        matmul_dtype=getattr(model, "matmul_dtype", None),
                    )
                )
        return tape.gradient(loss, [model.softmax_kernel, model.softmax_bias, states])

    return {"part": "sampled softmax, both directions", "ms": timed(softmax, states, repeats=repeats), "flop": flop}


def update_and_whole_step(model, optimizer, batch, flop, repeats):
    """The optimizer update alone, and the whole step (forward + backward of the loss, then the update)."""
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function
    def whole(batch):
        with tf.GradientTape() as tape:
            fwd, bwd, count = model.losses_sum(batch, training=True)
            loss = 0.5 * (fwd + bwd) / count
        return loss, tape.gradient(loss, variables)

    _, grads = whole(batch)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(0)

    apply_ms = timed(apply, grads, repeats=repeats)
    whole_ms = timed(lambda b: whole(b)[0], batch, repeats=repeats)
    return [
        {"part": "optimizer update", "ms": apply_ms, "flop": 0},
        {"part": "whole step (forward + backward + update)", "ms": whole_ms + apply_ms, "flop": flop},
    ]


def profile_parts(trainer, vocab, corpus, batch_size, max_tokens, repeats):
    """Milliseconds (median of `repeats`) and GFLOP/s of each part of one step, on one batch of median length:
    `{"rows", "length", "targets", "positions", "parts": [{"part", "ms", "flop", "gflops"}, ...]}`."""
    import tensorflow as tf

    model = trainer.model
    batch, input_ms = median_batch(trainer, vocab, corpus, batch_size, max_tokens, repeats * 4)
    rows, length = (int(n) for n in batch["token_ids"].shape)
    targets = int(tf.reduce_sum(tf.cast(batch["token_ids"] > 0, tf.int32))) + rows
    positions = rows * (length + 2)  # what the LSTMs and the char CNN compute on (padding included)
    options = model.config.to_options()
    flops = model_flops(options, model.num_sampled)
    whole = 3 * flops_per_target(options, model.num_sampled) * targets
    parts = [
        {"part": "input pipeline (per batch)", "ms": input_ms, "flop": 0},
        char_cnn_part(model, batch, positions, flops["char_cnn"], repeats),
        *lstm_parts(model, rows, length, flops["lstm"], repeats),
        softmax_part(model, targets, 3 * flops["softmax"] * targets, repeats),
        *update_and_whole_step(model, trainer.optimizer, batch, whole, repeats),
    ]
    for part in parts:
        part["gflops"] = part["flop"] / part["ms"] / 1e6 if part["flop"] else None
    return {"rows": rows, "length": length, "targets": targets, "positions": positions, "parts": parts}
