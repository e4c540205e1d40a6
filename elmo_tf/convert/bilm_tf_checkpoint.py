"""bilm-tf training checkpoints (TF1 `tf.train.Saver`, V2 format) -> `options.json` + `weights.hdf5` + `softmax.hdf5`.

What bilm-tf's `bin/dump_weights.py` (`bilm/training.py::dump_weights`) does, without TF1: the checkpoint is read
with `tf.train.load_checkpoint`, and each trainable variable of the `lm/` scope is written under the name
dump_weights gives it, with the same values (float32, bit for bit):

    checkpoint (bilm-tf's training graph)                         weights.hdf5
    lm/char_embed                  (261, char_dim)                char_embed      (261 rows, as stored)
    lm/CNN/W_cnn_{k}, lm/CNN/b_cnn_{k}                            CNN/W_cnn_{k}, CNN/b_cnn_{k}
    lm/CNN_high_{k}/{W,b}_{carry,transform}                       CNN_high_{k}/...
    lm/CNN_proj/{W_proj,b_proj}                                   CNN_proj/...
    lm/RNN_{d}/rnn/multi_rnn_cell/cell_{l}/lstm_cell/kernel       RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0
                                                    /bias                                                 /B
                                                    /projection/kernel                                    /W_P_0
    lm/softmax/W (vocab, P), lm/softmax/b (vocab,)                softmax.hdf5: softmax/W, softmax/b

Left out, as dump_weights leaves them: optimizer slots (`.../Adagrad`), `global_step`, `train_perplexity`. One
difference: a 1-layer biLM has no MultiRNNCell in the training graph (`lm/RNN_{d}/rnn/lstm_cell/...`), which
dump_weights writes as `RNN_{d}/RNN/LSTMCell/...`, a name that neither bilm-tf's inference code nor elmo_tf reads;
here it is written as `.../MultiRNNCell/Cell0/LSTMCell/...`, the name both read.

The checkpoint: the one the dir's `checkpoint` file names (by base name, since that file holds absolute paths and
the dir may have moved), else the `model.ckpt-<step>.index` with the largest step. The options: the dir's
`options.json` (bilm-tf's `train` writes it there) or `options=`; written with `char_cnn.n_characters` 262 (bilm-tf
trains with 261; a zero padding row is prepended at load time), every other key kept.
"""

import logging
import os
import re

from elmo_tf.convert import ConvertError, is_regular_file
from elmo_tf.convert.common import (
    OPTIONS,
    Checkpoint,
    check_shapes,
    inference_options,
    latest_checkpoint,
    read_options,
    write_outputs,
)

logger = logging.getLogger(__name__)

SCOPE = "lm/"
_LSTM = re.compile(
    r"RNN_(?P<d>[01])/rnn/(?:multi_rnn_cell/cell_(?P<layer>[0-9]+)/)?lstm_cell/(?P<var>kernel|bias|projection/kernel)"
)
_LSTM_NAMES = {"kernel": "W_0", "bias": "B", "projection/kernel": "W_P_0"}
_CNN = re.compile(r"char_embed|CNN/[Wb]_cnn_[0-9]+|CNN_high_[0-9]+/[Wb]_(?:carry|transform)|CNN_proj/[Wb]_proj")
SOFTMAX = ("softmax/W", "softmax/b")


def hdf5_name(variable):
    """The weights.hdf5 dataset name of checkpoint variable `variable` (`lm/...`), or None for one that is not a
    biLM weight (the softmax, optimizer slots, counters, names this converter does not know)."""
    if not variable.startswith(SCOPE):
        return None
    name = variable[len(SCOPE) :]
    if _CNN.fullmatch(name):
        return name
    match = _LSTM.fullmatch(name)
    if match:
        layer = match["layer"] or "0"
        return f"RNN_{match['d']}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/{_LSTM_NAMES[match['var']]}"
    return None


def _is_slot(name, names):
    """An optimizer slot (`lm/char_embed/Adagrad`): its name extends another variable's name."""
    parts = name.split("/")
    return any("/".join(parts[:k]) in names for k in range(1, len(parts)))


def bilm_variables(checkpoint):
    """{hdf5 dataset name: checkpoint variable} of `checkpoint`'s biLM weights, in the checkpoint's order."""
    names = set(checkpoint.shapes)
    found = {}
    for variable in sorted(names):
        if _is_slot(variable, names):
            continue
        target = hdf5_name(variable)
        if target is not None:
            found[target] = variable
        elif variable.startswith(SCOPE) and variable[len(SCOPE) :] not in SOFTMAX:
            logger.warning(
                "%s: ignored the variable %s, which is not part of bilm-tf's biLM", checkpoint.prefix, variable
            )
    return found


def convert(src_dir, out_dir, options=None):
    """Converts the bilm-tf training dir `src_dir` into `out_dir` (an existing directory).

    Args:
        src_dir: holds `model.ckpt-<step>.index` + `.data-*` (and usually `checkpoint` and `options.json`).
        out_dir: where `options.json`, `weights.hdf5` and, when the checkpoint holds the softmax, `softmax.hdf5`
            are written.
        options: the options.json to use instead of `src_dir/options.json`.
    Returns:
        the written paths.
    Raises:
        ConvertError: no checkpoint, no options, a checkpoint without bilm-tf variables, a forward-only LM, or
            shapes that disagree with the options (the message names the file and what was expected).
    """
    prefix = latest_checkpoint(src_dir)
    checkpoint = Checkpoint(prefix)
    source = f"{prefix}.index"
    found = bilm_variables(checkpoint)
    if not found:
        raise ConvertError(
            f"{source}: holds no bilm-tf biLM variables (expected lm/char_embed, lm/CNN/..., lm/RNN_0/...; found "
            f"{len(checkpoint.shapes)} other variables)",
            path=source,
        )
    if any(name.startswith(f"{SCOPE}rnn/") for name in checkpoint.shapes):
        raise ConvertError(
            f"{source}: a forward-only LM (lm/rnn/..., bilm-tf's bidirectional=false); ELMo needs RNN_0 and RNN_1",
            path=source,
        )
    options_path = options or os.path.join(src_dir, OPTIONS)
    if options is None and not is_regular_file(options_path, "bilm-tf's options.json"):
        raise ConvertError(
            f"{options_path}: no such file; expected bilm-tf's options.json beside the checkpoint (or give --options)",
            path=options_path,
        )
    opts = inference_options(read_options(options_path), options_path)
    check_shapes({name: checkpoint.shapes[v] for name, v in found.items()}, opts, source, options_path)
    weights = {name: checkpoint.read(variable) for name, variable in found.items()}
    return write_outputs(out_dir, opts, weights, softmax=_softmax(checkpoint, opts, source))


def _softmax(checkpoint, options, source):
    """(W, b) of `lm/softmax/` checked against each other and the options, or None when the checkpoint has none."""
    names = [SCOPE + name for name in SOFTMAX]
    present = [name in checkpoint.shapes for name in names]
    if not any(present):
        logger.info("%s: no lm/softmax/W: no softmax.hdf5 written", source)
        return None
    if not all(present):
        missing = names[present.index(False)]
        raise ConvertError(f"{source}: has {names[present.index(True)]} but no {missing}", path=source)
    (w_shape, b_shape), proj = [checkpoint.shapes[name] for name in names], options["lstm"]["projection_dim"]
    vocab = options.get("n_tokens_vocab", w_shape[0] if len(w_shape) == 2 else None)
    if w_shape != (vocab, proj) or b_shape != (vocab,):
        raise ConvertError(
            f"{source}: lm/softmax/W {w_shape} and lm/softmax/b {b_shape}, expected ({vocab}, {proj}) and ({vocab},) "
            "from the options (n_tokens_vocab, lstm.projection_dim)",
            path=source,
        )
    return tuple(checkpoint.read(name) for name in names)
