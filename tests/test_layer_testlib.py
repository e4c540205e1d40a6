"""tests/layer_testlib.py catches what it claims to: each broken layer below (a public layer with one fault) fails
its check with the matching message, and the other process reports a numeric difference of 2e-6 and a class it
cannot find."""

import keras
import numpy as np
import pytest
from keras import ops
from layer_testlib import any_nonzero, run_layer_test, same_mask

from elmo_tf.layers import CRF, CharCNN, Highway, ScalarMix

register = keras.saving.register_keras_serializable(package="elmo_tf")  # the check reads the elmo_tf> name


class UnregisteredHighway(Highway):
    pass


@register
class HighwayWithoutActivationInConfig(Highway):
    def get_config(self):
        config = super().get_config()
        del config["activation"]
        return config


@register
class HighwayConfigSaysTanh(Highway):
    """Computes with relu, but its config says tanh: a clone from the config computes something else."""

    def get_config(self):
        return {**super().get_config(), "activation": "tanh"}


@register
class CRFDroppingTheMask(CRF):
    def compute_mask(self, inputs, mask=None):
        return None


@register
class CharCNNWithAWrongOutputShape(CharCNN):
    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.projection_dim + 1,)


@register
class ScalarMixNormalizingOverPadding(ScalarMix):
    """Layer norm over every position, padding included (the per-sentence statistics ignore the mask)."""

    def _normalize(self, x, mask):
        return super()._normalize(x, ops.ones_like(mask))


def mix_inputs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    hs = [rng.normal(size=(len(lengths), max(lengths), 4)).astype(np.float32) * (k + 1) for k in range(3)]
    return hs, np.arange(max(lengths))[None] < np.array(lengths)[:, None]


def test_passes_a_sound_layer():
    layer, outputs = run_layer_test(Highway, dict(num_layers=1), np.ones((2, 3), np.float32), fresh_process=None)
    assert isinstance(layer, Highway) and outputs.shape == (2, 3)


@pytest.mark.parametrize(
    "cls,match",
    [
        (UnregisteredHighway, "not registered under elmo_tf"),
        (HighwayWithoutActivationInConfig, r"leaves out __init__ arguments \['activation'\]"),
        (HighwayConfigSaysTanh, "clone from config"),
    ],
    ids=["unregistered", "argument-missing", "clone-differs"],
)
def test_config_faults(cls, match):
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    with pytest.raises(AssertionError, match=match):
        run_layer_test(cls, dict(num_layers=1), x, fresh_process=None)


def test_a_dropped_output_mask():
    x, mask = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32), np.array([[1, 1, 0], [1, 0, 0]], bool)
    run_layer_test(CRF, dict(num_tags=4), x, mask=mask, output_mask=same_mask, fresh_process=None)
    with pytest.raises(AssertionError, match="carries no mask"):
        run_layer_test(CRFDroppingTheMask, dict(num_tags=4), x, mask=mask, output_mask=same_mask, fresh_process=None)


def test_a_wrong_output_shape(to_char_ids):
    ids = to_char_ids([["a", "bc"], ["d"]])
    init = dict(filters=((1, 2), (2, 2)), num_highway=1, projection_dim=3, char_embedding_dim=2)
    run_layer_test(CharCNN, init, ids, output_mask=any_nonzero, fresh_process=None)
    with pytest.raises(AssertionError, match="shape"):
        run_layer_test(CharCNNWithAWrongOutputShape, init, ids, output_mask=any_nonzero, fresh_process=None)


@pytest.mark.parametrize("recipe", ["appended padding", "batched after longer sentences"])
def test_a_layer_that_reads_padding(recipe):
    hs, mask = mix_inputs([3, 2])
    mates, mates_mask = mix_inputs([5], seed=1)
    padding = (
        dict(pad_value=100.0) if recipe == "appended padding" else dict(pad_value=100.0, pad_steps=0, batch_mates=mates)
    )
    options = dict(mask=mask, output_mask=same_mask, batch_mates_mask=mates_mask, fresh_process=None, **padding)
    init = dict(num_layers=3, layer_norm=True)
    run_layer_test(ScalarMix, init, hs, **options)
    with pytest.raises(AssertionError, match=recipe):
        run_layer_test(ScalarMixNormalizingOverPadding, init, hs, **options)


def test_the_other_process_compares_numbers_and_finds_only_elmo_tf_classes(fresh_process, tmp_path):
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    layer = Highway(1, name="hw")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, layer(inputs))
    request = fresh_process.save(model, [x], "hw")
    fresh_process.ask(request)  # as saved
    data = dict(np.load(f"{request['directory']}/data.npz"))
    data["out0"] = data["out0"] + 2e-6
    np.savez(f"{request['directory']}/data.npz", **data)
    with pytest.raises(AssertionError, match="output 0"):
        fresh_process.ask(request)
    model = keras.Model(inputs, HighwayWithoutActivationInConfig(1, name="hw2")(inputs))
    with pytest.raises(AssertionError, match="HighwayWithoutActivationInConfig"):  # registered in this process only
        fresh_process.check(model, [x], "hw2")
