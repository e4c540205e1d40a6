"""elmo_tf/pretraining/trainer.py with a converted model (`elmo-tf convert`) as --init-from: the trainer's data is
mapped by the model's own char mapping (bilm-tf's bytes, or an ELMoForManyLangs char vocabulary with its word id
column), so the run starts from the converted model: its top-layer states are the loaded `ELMo`'s and its loss at
step 0 is the loss of the model loaded from the files."""

import numpy as np
import pytest
import tensorflow as tf
from convert_testlib import converted_checkpoint, converted_efml

from elmo_tf.config import BiLMConfig
from elmo_tf.io.bilm_hdf5 import load_bilm_weights
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import load_elmo
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.pretraining import TrainConfig, Trainer, load_initial_weights
from elmo_tf.pretraining.model_dir import load_softmax

LINES = ["The cat sat on the mat .", "Мама мыла раму", "Café naïve " + "ж" * 60 + " 日本語 .", "cat"]
WORDS = ["<S>", "</S>", "<UNK>", "the", "cat", ".", "sat", "on", "mat", "Мама", "раму"]  # 11: the checkpoint's softmax


def _converted(kind, directory):
    if kind == "bilm-tf-checkpoint":
        out = converted_checkpoint(directory)
        Vocabulary(WORDS).save(str(out / "vocab.txt"))  # the run's vocabulary beside its softmax: both are taken
        return out
    return converted_efml(directory / kind, kind.split(":")[1])


@pytest.mark.parametrize("kind", ["bilm-tf-checkpoint", "elmoformanylangs:word", "elmoformanylangs:noword"])
@pytest.mark.slow
def test_init_from_a_converted_model_starts_from_its_weights(kind, tmp_path):
    model_dir = _converted(kind, tmp_path)
    options, weights = str(model_dir / "options.json"), str(model_dir / "weights.hdf5")
    (tmp_path / "train.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    vocab = Vocabulary(WORDS)
    config = BiLMConfig.from_json(options)
    train = TrainConfig(batch_size=4, num_sampled=4, optimizer="sgd", learning_rate=1e-3, dropout=0.0, steps=1)
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), config, train, vocab, [str(tmp_path / "train.txt")])
    load_initial_weights(trainer.model, vocab, options, weights)
    batch = trainer.first_batch()
    assert batch["char_ids"].shape[-1] == (51 if kind.endswith(":word") else 50)

    # the top layer the pretrainer trains is the converted ELMo's for the same sentences (same ids, same weights)
    out = trainer.model(batch, training=False)
    elmo = load_elmo(options, weights)
    tokens = [line.split() for line in LINES]
    width = max(len(t) for t in tokens)
    top = elmo.embed_tokens(tf.constant([[w.encode() for w in t] + [b""] * (width - len(t)) for t in tokens]))
    top = top["activations"][-1].numpy()
    p = config.projection_dim
    # every line is in the first length bucket (<= 10 tokens) and nothing is shuffled: the batch keeps their order
    expected_ids = [[vocab.word_to_id(w) for w in t] + [0] * (width - len(t)) for t in tokens]
    assert batch["token_ids"].numpy().tolist() == expected_ids
    for k in range(len(LINES)):
        n = len(tokens[k])
        np.testing.assert_allclose(out["forward"][k, 1 : n + 1], top[k, :n, :p], atol=1e-5, rtol=0)
        np.testing.assert_allclose(out["backward"][k, :n], top[k, :n, p:], atol=1e-5, rtol=0)

    # loss at step 0: the model loaded from the files (its softmax too where the dir has one) on the same batch
    loaded = BiLMPretrainer(config, len(vocab), dropout=0.0)
    load_bilm_weights(loaded, weights)
    if kind == "bilm-tf-checkpoint":
        load_softmax(loaded, str(model_dir / "softmax.hdf5"))
        with_softmax = trainer.model.softmax_kernel.numpy()
        np.testing.assert_array_equal(with_softmax, loaded.softmax_kernel.numpy())
    else:  # ELMoForManyLangs has no softmax: the run's starts fresh
        loaded.softmax_kernel.assign(trainer.model.softmax_kernel)
        loaded.softmax_bias.assign(trainer.model.softmax_bias)
    got = [float(x) for x in trainer.probe_loss(batch)]
    want = [float(x) for x in loaded.losses_sum(batch, training=False, sampled=False)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[2] == sum(len(t) + 1 for t in tokens)  # every word and </S> forward

    # and the first training step runs on these ids (a word-branch model trains its word embedding too)
    logs = trainer.fit(1)
    assert np.isfinite(logs["loss"])
