"""The TF Hub google/elmo module (TF1 hub format) -> `options.json` + `weights.hdf5` + `scalar_mix.json`.

A module dir holds `tfhub_module.pb` (the graph, not read here) and `variables/variables.{index,data-*}`, a TF1
checkpoint read with `tf.train.load_checkpoint`. Its variables are those of bilm-tf's inference graph
(`bilm/model.py::BidirectionalLanguageModelGraph`, scope `bilm`) plus the learned mix of the layers:

    module variable                                                   written as
    bilm/char_embed                  (262, char_dim), row 0 zero      weights.hdf5 char_embed (rows 1..261)
    bilm/CNN/..., bilm/CNN_high_{k}/..., bilm/CNN_proj/...            CNN/..., CNN_high_{k}/..., CNN_proj/...
    bilm/RNN_{d}/RNN/MultiRNNCell/Cell{l}/rnn/lstm_cell/kernel        RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0
                                                       /bias                                                   /B
                                                       /projection/kernel                                      /W_P_0
    aggregation/weights (L+1,), aggregation/scaling ()                scalar_mix.json

The LSTM names are those bilm-tf's `_pretrained_initializer` maps from (`.../CellN/rnn/lstm_cell/kernel` ->
`.../CellN/LSTMCell/W_0`) and those TF Hub logs when it initializes the module (tensorflow/hub#88). Other variables
(the LSTM state buffers of the stateful graph) are ignored.

`scalar_mix.json` holds the learned mix as `ScalarMix` arguments: {"num_layers": L+1, "initial_weights":
aggregation/weights (before the softmax), "initial_gamma": aggregation/scaling}, so
`ScalarMix(**json.load(open("scalar_mix.json")))` computes the module's `elmo` output, and
`load_scalar_mix(elmo.scalar_mixes[0], path)` sets an `ELMo` model's mix.

The options come from the variables' shapes (char dim, filters, highway layers, LSTM dim, projection, layers); what
shapes cannot say is the released model's (activation relu, cell_clip 3, proj_clip 3, skip connections), unless
`options=` names an options.json, which is then checked against the shapes.
"""

import json
import logging
import os
import re

import numpy as np

from elmo_tf.convert import ConvertError, is_regular_file
from elmo_tf.convert.common import Checkpoint, check_shapes, inference_options, read_options, write_outputs

logger = logging.getLogger(__name__)

SCOPE = "bilm/"
MIX = "scalar_mix.json"
_LSTM = re.compile(r"(RNN_[01]/RNN/MultiRNNCell/Cell[0-9]+)/rnn/lstm_cell/(kernel|bias|projection/kernel)")
_LSTM_NAMES = {"kernel": "W_0", "bias": "B", "projection/kernel": "W_P_0"}
_CNN = re.compile(r"char_embed|CNN/[Wb]_cnn_[0-9]+|CNN_high_[0-9]+/[Wb]_(?:carry|transform)|CNN_proj/[Wb]_proj")
# what the variables do not say: the released model's settings (elmo_2x4096_512_2048cnn_2xhighway_options.json)
RELEASED = {"activation": "relu", "cell_clip": 3, "proj_clip": 3, "use_skip_connections": True}


def hdf5_name(variable):
    """The weights.hdf5 dataset name of module variable `variable`, or None for one that is not a biLM weight."""
    if not variable.startswith(SCOPE):
        return None
    name = variable[len(SCOPE) :]
    if _CNN.fullmatch(name):
        return name
    match = _LSTM.fullmatch(name)
    return f"{match[1]}/LSTMCell/{_LSTM_NAMES[match[2]]}" if match else None


def options_from_shapes(shapes):
    """A bilm-tf options dict from {hdf5 dataset name: shape} (char_embed with the file's 261 rows) and `RELEASED`."""
    filters = []
    while f"CNN/W_cnn_{len(filters)}" in shapes:
        kernel = shapes[f"CNN/W_cnn_{len(filters)}"]
        filters.append([int(kernel[1]), int(kernel[3])] if len(kernel) == 4 else [0, 0])
    n_highway = 0
    while f"CNN_high_{n_highway}/W_carry" in shapes:
        n_highway += 1
    layers = 0
    while f"RNN_0/RNN/MultiRNNCell/Cell{layers}/LSTMCell/B" in shapes:
        layers += 1
    cell = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell"
    bias, projection = shapes.get(f"{cell}/B", (0,)), shapes.get(f"{cell}/W_P_0", (0, 0))
    return {
        "lstm": {
            "dim": int(bias[0]) // 4,
            "projection_dim": int(projection[-1]),
            "n_layers": layers,
            "cell_clip": RELEASED["cell_clip"],
            "proj_clip": RELEASED["proj_clip"],
            "use_skip_connections": RELEASED["use_skip_connections"],
        },
        "char_cnn": {
            "embedding": {"dim": int(shapes.get("char_embed", (0, 0))[-1])},
            "filters": filters,
            "n_highway": n_highway,
            "activation": RELEASED["activation"],
            "max_characters_per_token": 50,
            "n_characters": 262,
        },
    }


def convert(src_dir, out_dir, options=None):
    """Converts the TF Hub ELMo module in `src_dir` into `out_dir` (an existing directory).

    Args:
        src_dir: the module dir (`tfhub_module.pb`, `variables/variables.index` + `.data-*`), e.g. the unpacked
            https://tfhub.dev/google/elmo/3 tarball.
        out_dir: where `options.json`, `weights.hdf5` and `scalar_mix.json` are written.
        options: an options.json to use instead of the one derived from the shapes (checked against them).
    Returns:
        the written paths.
    Raises:
        ConvertError: a missing file, a module without `bilm/` variables, or shapes that disagree.
    """
    for required in ("tfhub_module.pb", os.path.join("variables", "variables.index")):
        path = os.path.join(src_dir, required)
        if not is_regular_file(path, "a TF1 Hub module file"):
            raise ConvertError(
                f"{path}: no such file; expected a TF1 Hub module dir (tfhub_module.pb, variables/variables.index)",
                path=path,
            )
    checkpoint = Checkpoint(os.path.join(src_dir, "variables", "variables"))
    source = f"{checkpoint.prefix}.index"
    found = {}
    for variable in sorted(checkpoint.shapes):
        name = hdf5_name(variable)
        if name is not None:
            found[name] = variable
        elif not variable.startswith("aggregation/"):
            logger.debug("%s: ignored %s", source, variable)
    if "char_embed" not in found:
        raise ConvertError(
            f"{source}: has no bilm/char_embed; expected the google/elmo module's variables (bilm/..., "
            "aggregation/...)",
            path=source,
        )
    shapes = {name: checkpoint.shapes[variable] for name, variable in found.items()}
    char_embed = shapes["char_embed"]
    if len(char_embed) != 2 or char_embed[0] != 262:
        raise ConvertError(f"{source}: bilm/char_embed has shape {char_embed}, expected (262, char_dim)", path=source)
    shapes["char_embed"] = (261, char_embed[1])  # row 0, the padding row, is left out of the file
    if options is None:
        options_path, opts = "the module's shapes", options_from_shapes(shapes)
    else:
        options_path, opts = options, read_options(options)
    opts = inference_options(opts, options_path)
    check_shapes(shapes, opts, source, options_path)
    weights = {name: checkpoint.read(variable) for name, variable in found.items()}
    if np.any(weights["char_embed"][0]):
        logger.warning(
            "%s: bilm/char_embed row 0 (padding) is not zero; it is left out, as for every weight file", source
        )
    weights["char_embed"] = weights["char_embed"][1:]
    paths = write_outputs(out_dir, opts, weights)
    mix = _scalar_mix(checkpoint, opts["lstm"]["n_layers"] + 1, source)
    if mix is not None:
        from elmo_tf.io.atomic import write_json

        paths.append(os.path.join(out_dir, MIX))
        write_json(paths[-1], mix)
    return paths


def _scalar_mix(checkpoint, num_layers, source):
    """The `ScalarMix` arguments of `aggregation/weights` and `aggregation/scaling`, or None without them."""
    if "aggregation/weights" not in checkpoint.shapes:
        logger.info("%s: no aggregation/weights: no %s written", source, MIX)
        return None
    if checkpoint.shapes["aggregation/weights"] != (num_layers,):
        shape = checkpoint.shapes["aggregation/weights"]
        raise ConvertError(f"{source}: aggregation/weights has shape {shape}, expected ({num_layers},)", path=source)
    scaling = checkpoint.read("aggregation/scaling") if "aggregation/scaling" in checkpoint.shapes else np.ones(())
    if scaling.size != 1:
        raise ConvertError(f"{source}: aggregation/scaling has shape {scaling.shape}, expected ()", path=source)
    weights = checkpoint.read("aggregation/weights")
    return {
        "num_layers": num_layers,
        "initial_weights": [float(w) for w in weights],
        "initial_gamma": float(scaling.reshape(())),
    }


def load_scalar_mix(mix, path):
    """Sets the `ScalarMix` layer `mix` (built) to the weights and gamma of a `scalar_mix.json` at `path`."""
    is_regular_file(path, "a scalar_mix.json")
    with open(path, encoding="utf-8") as f:
        values = json.load(f)
    if values["num_layers"] != mix.num_layers:
        raise ConvertError(f"{path}: num_layers {values['num_layers']}, the ScalarMix has {mix.num_layers}", path=path)
    mix.scalar_weights.assign(np.asarray(values["initial_weights"], dtype=mix.scalar_weights.dtype))
    mix.gamma.assign(np.asarray(values["initial_gamma"], dtype=mix.gamma.dtype))
