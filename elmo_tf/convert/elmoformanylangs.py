"""ELMoForManyLangs (HIT-SCIR) model dirs -> `options.json` + `weights.hdf5` (+ char and word vocabularies).

A model dir holds `config.json` (its `config_path` names the architecture JSON: `token_embedder` and `encoder`),
`char.dic` and `word.dic` (`entry<TAB>id` lines), and `token_embedder.pkl` / `encoder.pkl`, torch state dicts
(read by `elmo_tf.io.torch_pickle`: no torch, nothing in them runs). What the conversion maps (checked against
ELMoForManyLangs 0.0.4's `frontend.py`, `elmo.py` and `modules/`):
- chars: code points looked up in `char.dic` (`<oov>` when missing), tokens cut to 48 code points, rows
  `[<eow>'s id, chars, <bow>'s id, <pad>, ...]` (its `create_one_batch` swaps the two; training had it too), the
  boundary tokens `<bos>` / `<eos>` as one char each; the `<pad>` row is a trained row (options `special_ids`);
- words: the cut token looked up in `word.dic` (`<oov>` when missing); the token vector is
  `projection([word; highway(char CNN)])`, projected even when the sizes agree (`always_project`);
- highway: `y = g x + (1 - g) relu(A x)` with `[A; B] = weight`, `g = sigmoid(B x)`: our `Highway` gates the
  nonlinear branch, so its carry weights are `-B` (sigmoid(-z) = 1 - sigmoid(z));
- LSTM (AllenNLP's `LstmCellWithProjection`): gates i, f, g, o with the forget bias stored; our cell is TF1's
  (i, j, f, o, forget bias +1 added at run time): columns reordered, 1 taken off the stored forget bias; residual
  connections from layer 2 on, always.
"""

import codecs
import json
import os

import numpy as np

from elmo_tf.config import BiLMConfig, ConfigError
from elmo_tf.convert import is_regular_file
from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.io.atomic import atomic_hdf5
from elmo_tf.io.torch_pickle import load_state_dict

# elmoformanylangs/configs/cnn_{0,50}_100_512_4096_sample.json (the same content): the released models' config.json
# names one of them, and the package falls back to its own copy when the model dir lacks it
_PACKAGE_CONFIG = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
_PACKAGE_CONFIGS = ("cnn_0_100_512_4096_sample.json", "cnn_50_100_512_4096_sample.json")
CHAR_ENTRIES = ("<bow>", "<eow>", "<oov>", "<pad>", "<bos>", "<eos>")
WORD_ENTRIES = ("<oov>", "<pad>")


class ModelDirError(ElmoTFError):
    """An ELMoForManyLangs model dir elmo_tf cannot convert: the message names the file and what was expected."""


def _fail(path, problem):
    raise ModelDirError(f"{path}: {problem}", path=str(path))


def _regular(path, expected):
    return is_regular_file(path, expected, error=ModelDirError)


def _read_json(path, what):
    if not _regular(path, what):
        _fail(path, f"missing: an ELMoForManyLangs model dir holds {what}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _fail(path, f"not a JSON {what}: {one_line(e)}")


def read_architecture(src_dir):
    """`(architecture dict, its path)`: `config.json`'s `config_path`, found as ELMoForManyLangs finds it (as given
    relative to the dir, then its file name in the dir, then the package's own copy of its two sample configs)."""
    top_path = os.path.join(src_dir, "config.json")
    top = _read_json(top_path, "config.json with a config_path")
    if not isinstance(top, dict) or not isinstance(top.get("config_path"), str):
        _fail(top_path, "expected a JSON object with a string 'config_path' (the architecture JSON)")
    name = top["config_path"]
    for path in (os.path.join(src_dir, name), os.path.join(src_dir, os.path.basename(name))):
        if _regular(path, "the architecture JSON"):
            return _read_json(path, "architecture JSON"), path
    if os.path.basename(name) in _PACKAGE_CONFIGS:
        return json.loads(json.dumps(_PACKAGE_CONFIG)), f"elmoformanylangs/configs/{os.path.basename(name)}"
    _fail(top_path, f"config_path {name!r} names no file in the model dir (nor one of the package's sample configs)")


def read_dictionary(path, required):
    """`{entry: id}` of `char.dic` / `word.dic`, read line by line as ELMoForManyLangs reads it (`codecs` lines,
    stripped, split on tab; a lone id is the entry U+3000, whose line `strip` emptied; later lines win).

    Raises:
        ModelDirError: a missing file, a line that is not `entry<TAB>id` with an int id >= 0 (naming `path:line`), or
            a missing entry of `required`.
    """
    if not _regular(path, "a dictionary (entry<TAB>id lines)"):
        _fail(path, "missing: the model needs its dictionary (entry<TAB>id lines)")
    lexicon = {}
    try:
        with codecs.open(path, "r", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                fields = line.strip().split("\t")
                if len(fields) == 1:
                    fields.insert(0, "\u3000")
                try:
                    entry, i = fields
                    i = int(i)
                    if i < 0:
                        raise ValueError
                except ValueError:
                    raise ModelDirError(
                        f"{path}:{number}: expected 'entry<TAB>id' with an int id >= 0, got {line.rstrip()[:60]!r}",
                        path=str(path),
                        line=number,
                    ) from None
                lexicon[entry] = i
    except UnicodeDecodeError as e:
        _fail(path, f"not UTF-8 text: {one_line(e)}")
    missing = [entry for entry in required if entry not in lexicon]
    if missing:
        _fail(path, f"lacks the entries {missing} (ELMoForManyLangs' dictionaries hold {list(required)})")
    beyond = [(entry, i) for entry, i in lexicon.items() if i >= len(lexicon)]
    if beyond:
        _fail(path, f"entry {beyond[0][0]!r} has id {beyond[0][1]}, beyond the dictionary's {len(lexicon)} rows")
    return lexicon


def _check_architecture(arch, path):
    if not isinstance(arch, dict) or not isinstance(arch.get("token_embedder"), dict):
        _fail(path, "expected an object with 'token_embedder' and 'encoder' sections")
    if not isinstance(arch.get("encoder"), dict):
        _fail(path, "expected an object with 'token_embedder' and 'encoder' sections")
    embedder, encoder = arch["token_embedder"], arch["encoder"]
    if str(embedder.get("name", "")).lower() != "cnn":
        _fail(path, f"token_embedder.name is {embedder.get('name')!r}; only 'cnn' (a char CNN) converts, not 'lstm'")
    if str(encoder.get("name", "")).lower() != "elmo":
        _fail(path, f"encoder.name is {encoder.get('name')!r}; only 'elmo' (the biLM) converts, not 'lstm'")
    needed = {"token_embedder": ("char_dim", "word_dim", "filters", "n_highway", "activation"), "encoder": ()}
    needed["encoder"] = ("dim", "projection_dim", "n_layers")
    for section, keys in needed.items():
        for key in keys:
            if key not in arch[section]:
                _fail(path, f"{section}.{key} is missing")
    if not isinstance(embedder["char_dim"], int) or embedder["char_dim"] <= 0:
        _fail(path, f"token_embedder.char_dim must be a positive int (a char CNN), got {embedder['char_dim']!r}")
    if not isinstance(embedder["word_dim"], int) or embedder["word_dim"] < 0:
        _fail(path, f"token_embedder.word_dim must be an int >= 0, got {embedder['word_dim']!r}")


def _bilm_config(arch, chars, words, path):
    embedder, encoder = arch["token_embedder"], arch["encoder"]
    word_dim = embedder["word_dim"]
    kwargs = {}
    if word_dim:
        oov = words["<oov>"]
        kwargs = dict(
            word_embedding_dim=word_dim,
            num_words=len(words),
            word_vocabulary=words,
            word_special_ids={"oov": oov, "bos": words.get("<bos>", oov), "eos": words.get("<eos>", oov)},
        )
    try:
        return BiLMConfig(
            char_embedding_dim=embedder["char_dim"],
            filters=embedder["filters"],
            num_highway=embedder["n_highway"],
            activation=embedder["activation"],
            max_characters_per_token=embedder.get("max_characters_per_token", 50),
            num_characters=len(chars) + 1,
            lstm_dim=encoder["dim"],
            projection_dim=encoder["projection_dim"],
            num_layers=encoder["n_layers"],
            cell_clip=encoder.get("cell_clip"),
            proj_clip=encoder.get("proj_clip"),
            use_skip_connections=True,
            char_vocabulary=chars,
            char_special_ids={  # the swap of create_one_batch: a token starts with <eow>'s id, ends with <bow>'s
                "bow": chars["<eow>"],
                "eow": chars["<bow>"],
                "pad": chars["<pad>"],
                "oov": chars["<oov>"],
                "bos": chars["<bos>"],
                "eos": chars["<eos>"],
            },
            always_project=True,
            **kwargs,
        )
    except ConfigError as e:
        _fail(path, f"{e.key}: {e.problem}" if e.key else e.problem)


def _expected_shapes(config):
    f, p, c = config.num_filters, config.projection_dim, config.lstm_dim
    token = {"char_emb_layer.embedding.weight": (config.num_characters - 1, config.char_embedding_dim)}
    if config.word_embedding_dim:
        token["word_emb_layer.embedding.weight"] = (config.num_words, config.word_embedding_dim)
    for k, (width, n) in enumerate(config.filters):
        token[f"convolutions.{k}.weight"] = (n, config.char_embedding_dim, width)
        token[f"convolutions.{k}.bias"] = (n,)
    for k in range(config.num_highway):
        token[f"highways._layers.{k}.weight"] = (2 * f, f)
        token[f"highways._layers.{k}.bias"] = (2 * f,)
    token["projection.weight"] = (p, f + config.word_embedding_dim)
    token["projection.bias"] = (p,)
    encoder = {}
    for direction in ("forward", "backward"):
        for layer in range(config.num_layers):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = (4 * c, p)
            encoder[f"{prefix}.state_linearity.weight"] = (4 * c, p)
            encoder[f"{prefix}.state_linearity.bias"] = (4 * c,)
            encoder[f"{prefix}.state_projection.weight"] = (p, c)
    return token, encoder


def _read_state(path, expected, config_path):
    if not _regular(path, "a PyTorch state dict pickle"):
        _fail(path, "missing: an ELMoForManyLangs model dir holds token_embedder.pkl and encoder.pkl")
    state = load_state_dict(path)
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        _fail(path, f"does not match {config_path}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for key, shape in expected.items():
        array = state[key]
        if array.shape != shape:
            _fail(path, f"{key} has shape {array.shape}, expected {shape} from {config_path} and the dictionaries")
        if array.dtype.kind != "f" or not np.all(np.isfinite(array)):
            _fail(path, f"{key} must hold finite floating-point numbers, got dtype {array.dtype}")
    return {k: v.astype(np.float32) for k, v in state.items()}


def _gates_to_tf(w):
    """AllenNLP's gate blocks (i, f, g, o) along axis 0 -> TF1's (i, j=g, f, o)."""
    i, f, g, o = np.split(w, 4, axis=0)
    return np.concatenate([i, g, f, o], axis=0)


def bilm_datasets(config, token, encoder):
    """The `weights.hdf5` datasets (bilm-tf layout, `elmo_tf.io.bilm_hdf5`) of the two state dicts."""
    out = {"char_embed": token["char_emb_layer.embedding.weight"]}
    if config.word_embedding_dim:
        out["word_embed"] = token["word_emb_layer.embedding.weight"]
    for k in range(len(config.filters)):
        out[f"CNN/W_cnn_{k}"] = token[f"convolutions.{k}.weight"].transpose(2, 1, 0)[None]
        out[f"CNN/b_cnn_{k}"] = token[f"convolutions.{k}.bias"]
    f = config.num_filters
    for k in range(config.num_highway):
        weight, bias = token[f"highways._layers.{k}.weight"], token[f"highways._layers.{k}.bias"]
        out[f"CNN_high_{k}/W_transform"] = weight[:f].T
        out[f"CNN_high_{k}/b_transform"] = bias[:f]
        out[f"CNN_high_{k}/W_carry"] = -weight[f:].T  # their gate carries x; ours gates the nonlinear branch
        out[f"CNN_high_{k}/b_carry"] = -bias[f:]
    out["CNN_proj/W_proj"] = token["projection.weight"].T
    out["CNN_proj/b_proj"] = token["projection.bias"]
    for d, direction in enumerate(("forward", "backward")):
        for layer in range(config.num_layers):
            src = f"{direction}_layer_{layer}"
            dst = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            w_x = _gates_to_tf(encoder[f"{src}.input_linearity.weight"])
            w_h = _gates_to_tf(encoder[f"{src}.state_linearity.weight"])
            bias = _gates_to_tf(encoder[f"{src}.state_linearity.bias"]).copy()
            c = config.lstm_dim
            bias[2 * c : 3 * c] -= 1.0  # TF1's cell adds the forget bias 1.0 at run time
            out[f"{dst}/W_0"] = np.concatenate([w_x.T, w_h.T], axis=0)
            out[f"{dst}/B"] = bias
            out[f"{dst}/W_P_0"] = encoder[f"{src}.state_projection.weight"].T
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def convert(src_dir, out_dir):
    """Converts the ELMoForManyLangs model dir `src_dir` into `out_dir` (which exists): `options.json`,
    `weights.hdf5`, `char_vocab.tsv` and, with a word embedding, `word_vocab.tsv`. Returns the paths written.

    Everything is read and checked before anything is written.

    Raises:
        ModelDirError / TorchPickleError / ConfigError: one line naming the file and what was expected: a missing
            file, a dictionary line that is not `entry<TAB>id`, an unknown token_embedder or encoder (`lstm`), a
            state dict whose keys or shapes disagree with the architecture and the dictionaries, or a pickle that
            asks for anything but tensors.
    """
    arch, arch_path = read_architecture(src_dir)
    _check_architecture(arch, arch_path)
    chars = read_dictionary(os.path.join(src_dir, "char.dic"), CHAR_ENTRIES)
    words = None
    if arch["token_embedder"]["word_dim"]:
        words = read_dictionary(os.path.join(src_dir, "word.dic"), WORD_ENTRIES)
    config = _bilm_config(arch, chars, words, arch_path)
    token_shapes, encoder_shapes = _expected_shapes(config)
    token = _read_state(os.path.join(src_dir, "token_embedder.pkl"), token_shapes, arch_path)
    encoder = _read_state(os.path.join(src_dir, "encoder.pkl"), encoder_shapes, arch_path)
    datasets = bilm_datasets(config, token, encoder)
    weights_path = os.path.join(out_dir, "weights.hdf5")
    with atomic_hdf5(weights_path) as f:
        for name, array in datasets.items():
            f.create_dataset(name, data=array)
    return [*config.to_json(os.path.join(out_dir, "options.json")), weights_path]
