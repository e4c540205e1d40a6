"""elmo_tf.convert.common.check_shapes: the shapes a converter checks are those the weight-file loader reads
(`elmo_tf.io.bilm_hdf5.file_shapes`, the one source), in the released bilm-tf layout."""

import pytest

from elmo_tf.config import BiLMConfig
from elmo_tf.convert import ConvertError
from elmo_tf.convert.common import check_shapes, inference_options
from elmo_tf.io.bilm_hdf5 import file_shapes

OPTIONS = {
    "char_cnn": {"filters": [[1, 4], [2, 8]], "n_highway": 1, "embedding": {"dim": 3}, "n_characters": 261},
    "lstm": {"dim": 10, "projection_dim": 6, "n_layers": 2},
}
# the bilm-tf layout of these options, written out by hand (elmo_tf/io/bilm_hdf5.py's docstring)
LAYOUT = {
    "char_embed": (261, 3),
    "CNN/W_cnn_0": (1, 1, 3, 4),
    "CNN/b_cnn_0": (4,),
    "CNN/W_cnn_1": (1, 2, 3, 8),
    "CNN/b_cnn_1": (8,),
    "CNN_high_0/W_carry": (12, 12),
    "CNN_high_0/b_carry": (12,),
    "CNN_high_0/W_transform": (12, 12),
    "CNN_high_0/b_transform": (12,),
    "CNN_proj/W_proj": (12, 6),
    "CNN_proj/b_proj": (6,),
    **{
        f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/{name}": shape
        for d in range(2)
        for layer in range(2)
        for name, shape in (("W_0", (12, 40)), ("B", (40,)), ("W_P_0", (10, 6)))
    },
}


@pytest.fixture
def options():
    return inference_options(OPTIONS, "options.json")


def test_the_checked_shapes_are_the_loaders_and_the_released_layout(options):
    loader = {name: shapes[0] for name, shapes in file_shapes(BiLMConfig.from_options(options)).items()}
    assert loader == LAYOUT
    check_shapes(LAYOUT, options, "ckpt.index", "options.json")  # no error


def test_a_wrong_missing_or_extra_dataset_is_named(options):
    wrong = {**LAYOUT, "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0": (12, 41)}
    with pytest.raises(ConvertError, match=r"ckpt.index: 'RNN_1/.*/Cell1/LSTMCell/W_0' has shape \(12, 41\), expected"):
        check_shapes(wrong, options, "ckpt.index", "options.json")
    missing = {name: shape for name, shape in LAYOUT.items() if name != "CNN_proj/b_proj"}
    with pytest.raises(ConvertError, match=r"no variable for 'CNN_proj/b_proj' \(expected shape \(6,\)"):
        check_shapes(missing, options, "ckpt.index", "options.json")
    with pytest.raises(ConvertError, match="holds 'CNN_high_1/W_carry', which options.json does not describe"):
        check_shapes({**LAYOUT, "CNN_high_1/W_carry": (12, 12)}, options, "ckpt.index", "options.json")
