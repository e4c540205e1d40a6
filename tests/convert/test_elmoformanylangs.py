"""elmo_tf/convert/elmoformanylangs.py: ELMoForManyLangs model dirs convert with parity to its own code.

tests/fixtures/efml/{word,noword}/ hold small random-weight models made with ELMoForManyLangs' own classes and the
outputs its own `Embedder` gave for them (bench/record_efml_fixtures.py; zero-state first batch): `word` has
the word embedding (torch's legacy pickle format), `noword` the char CNN alone with filter total = projection size
(zip format), so the projection is kept only by `always_project`.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.convert.elmoformanylangs import convert
from elmo_tf.errors import ElmoTFError
from elmo_tf.models.elmo import load_elmo

EFML = Path(__file__).resolve().parents[1] / "fixtures" / "efml"
with open(EFML / "sentences.json", encoding="utf-8") as _f:
    SENTENCES = json.load(_f)
ATOL = 1e-5
VARIANTS = ["word", "noword"]


def _expected(name):
    with np.load(EFML / name / "expected.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{variant: (out_dir, written paths)}, converted once per module."""
    out = {}
    for name in VARIANTS:
        target = tmp_path_factory.mktemp(f"efml_{name}")
        out[name] = (target, convert(str(EFML / name / "model"), str(target)))
    return out


@pytest.fixture(scope="module")
def models(converted):
    return {name: load_elmo(d / "options.json", d / "weights.hdf5") for name, (d, _) in converted.items()}


def _padded(sentences):
    width = max(len(s) for s in sentences)
    return np.array([[t.encode("utf-8") for t in s] + [b""] * (width - len(s)) for s in sentences], dtype=object)


def _worst(activations, expected):
    """Max |diff| per layer between (S, L+1, T, 2P)-shaped outputs, over real tokens only."""
    lengths = expected["lengths"]
    worst = []
    for layer in range(expected["activations"].shape[1]):
        diffs = [
            np.abs(activations[k][layer][:n] - expected["activations"][k, layer, :n]).max()
            for k, n in enumerate(lengths)
        ]
        worst.append(float(max(diffs)))
    return worst


def test_writes_options_weights_and_vocabularies(converted):
    out_dir, written = converted["word"]
    assert sorted(Path(p).name for p in written) == [
        "char_vocab.tsv",
        "options.json",
        "weights.hdf5",
        "word_vocab.tsv",
    ]
    options = json.loads((out_dir / "options.json").read_text())
    cnn = options["char_cnn"]
    assert cnn["char_vocabulary"] == "char_vocab.tsv" and cnn["word_embedding"]["vocabulary"] == "word_vocab.tsv"
    assert cnn["always_project"] is True
    chars = dict(line.split("\t") for line in (EFML / "word/model/char.dic").read_text("utf-8").splitlines())
    # the swap of create_one_batch: a token starts with <eow>'s id and ends with <bow>'s
    assert cnn["special_ids"]["bow"] == int(chars["<eow>"]) and cnn["special_ids"]["eow"] == int(chars["<bow>"])
    assert "\u3000" in (out_dir / "char_vocab.tsv").read_text("utf-8")  # the line `strip` empties, as they read it
    noword = sorted(Path(p).name for p in converted["noword"][1])
    assert noword == ["char_vocab.tsv", "options.json", "weights.hdf5"]


@pytest.mark.parametrize("name", VARIANTS)
def test_char_and_word_ids_equal_create_one_batch(models, name):
    """Code points looked up in char.dic, <oov> for unknown chars, tokens cut to 48 code points, the swapped
    bow/eow, the boundary tokens, and the word id of the cut token: ELMoForManyLangs' own ids, + 1."""
    expected, model = _expected(name), models[name]
    rows = [["<bos>", *s, "<eos>"] for s in SENTENCES]
    ids = model.tokens_to_char_ids(tf.constant(_padded(rows))).numpy()
    for k, s in enumerate(rows):
        n = len(s)
        np.testing.assert_array_equal(ids[k, :n, :50], expected["char_ids"][k, :n] + 1)
        if name == "word":
            np.testing.assert_array_equal(ids[k, :n, 50], expected["word_ids"][k, :n] + 1)
    np.testing.assert_array_equal(model.char_mapping.bos_row[:50], expected["char_ids"][0, 0] + 1)
    assert ids.shape[-1] == (51 if name == "word" else 50)


@pytest.mark.parametrize("name", VARIANTS)
def test_keras_layer_matches_elmoformanylangs_at_every_layer(models, name):
    expected = _expected(name)
    out = models[name].embed_tokens(tf.constant(_padded(SENTENCES)))
    acts = np.stack([a.numpy() for a in out["activations"]], axis=1)  # (S, L+1, T, 2P)
    worst = _worst(acts, expected)
    assert len(worst) == 3 and max(worst) <= ATOL, worst
    assert np.abs(expected["activations"]).max() > 0.05  # the fixture is not all zeros


@pytest.mark.parametrize("name", VARIANTS)
def test_embed_matches_elmoformanylangs_at_every_layer(models, name):
    from elmo_tf.embed import Embedder

    expected = _expected(name)
    got = Embedder(models[name], layers="all").embed_batch(SENTENCES)  # packed rows, the char CNN once per token
    worst = _worst(got, expected)
    assert max(worst) <= ATOL, worst


@pytest.mark.slow
def test_savedmodel_matches_elmoformanylangs_at_every_layer(models, tmp_path):
    from elmo_tf.saved_model.export import export_elmo

    expected = _expected("word")
    path = export_elmo(models["word"], str(tmp_path / "efml"), version=1)  # reloads and checks itself
    loaded = tf.saved_model.load(path)
    sentences = tf.constant([" ".join(s).encode("utf-8") for s in SENTENCES])
    out = loaded.signatures["default"](sentences=sentences)
    acts = np.stack(
        [np.concatenate([out["word_emb"]] * 2, axis=-1), out["lstm_outputs1"].numpy(), out["lstm_outputs2"].numpy()],
        axis=1,
    )
    worst = _worst(acts, expected)
    assert max(worst) <= ATOL, worst
    tokens = loaded.signatures["tokens"](
        tokens=tf.constant(_padded(SENTENCES)), sequence_len=tf.constant([len(s) for s in SENTENCES], tf.int32)
    )
    np.testing.assert_allclose(tokens["lstm_outputs2"].numpy(), out["lstm_outputs2"].numpy(), atol=1e-6)
    # a fresh process without elmo_tf: the SavedModel carries its vocabulary tables and takes raw strings
    code = (
        "import sys, json, numpy as np, tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "s = tf.constant([x.encode() for x in json.loads(sys.argv[2])])\n"
        "np.save(sys.argv[3], m.signatures['default'](sentences=s)['lstm_outputs2'].numpy())\n"
    )
    joined = json.dumps([" ".join(s) for s in SENTENCES])
    target = tmp_path / "fresh.npy"
    subprocess.run([sys.executable, "-c", code, path, joined, str(target)], check=True, capture_output=True)
    np.testing.assert_allclose(np.load(target), out["lstm_outputs2"].numpy(), atol=1e-6)


def test_keras_file_carries_the_vocabularies(models, tmp_path):
    import elmo_tf

    model = models["word"]
    model.save(tmp_path / "efml.keras")
    again = elmo_tf.load_model(tmp_path / "efml.keras")
    assert again.config == model.config
    tokens = tf.constant(_padded(SENTENCES[:3]))
    np.testing.assert_allclose(
        again.embed_tokens(tokens)["elmo"].numpy(), model.embed_tokens(tokens)["elmo"].numpy(), atol=1e-6
    )


def test_bilm_tf_options_are_unchanged():
    """A bilm-tf config writes exactly the keys it always wrote (no ELMoForManyLangs key appears)."""
    from elmo_tf.config import BiLMConfig

    options = BiLMConfig().to_options()
    assert sorted(options["char_cnn"]) == [
        "activation",
        "embedding",
        "filters",
        "max_characters_per_token",
        "n_characters",
        "n_highway",
    ]


# ------------------------------------------------------------------------------------------------- bad input


def _copy(name, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(EFML / name / "model", src)
    out = tmp_path / "out"
    out.mkdir()
    return src, out


def _refused(src, out, match, file):
    with pytest.raises(ElmoTFError, match=match) as e:
        convert(str(src), str(out))
    message = str(e.value)
    assert "\n" not in message and file in message, message
    assert list(out.iterdir()) == []  # nothing written
    return message


@pytest.mark.parametrize("missing", ["config.json", "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl"])
def test_a_missing_file_is_named(tmp_path, missing):
    src, out = _copy("word", tmp_path)
    (src / missing).unlink()
    _refused(src, out, "missing", missing)


def test_a_missing_architecture_json_is_named(tmp_path):
    src, out = _copy("word", tmp_path)
    (src / "arch.json").unlink()
    _refused(src, out, "config_path 'arch.json' names no file", "config.json")


@pytest.mark.parametrize("line", ["no tab here is fine? no: x\t", "a\tb\tc", "z\tseven", "q\t-3"])
def test_a_malformed_dictionary_line_is_named(tmp_path, line):
    src, out = _copy("word", tmp_path)
    with open(src / "word.dic", "a", encoding="utf-8") as f:
        f.write(line + "\n")
    message = _refused(src, out, "expected 'entry<TAB>id'", "word.dic")
    n = len((src / "word.dic").read_text("utf-8").splitlines())
    assert f"word.dic:{n}:" in message


def test_a_dictionary_without_its_special_entries_is_refused(tmp_path):
    src, out = _copy("noword", tmp_path)
    lines = [x for x in (src / "char.dic").read_text("utf-8").splitlines() if not x.startswith("<pad>\t")]
    (src / "char.dic").write_text("\n".join(lines) + "\n", "utf-8")
    _refused(src, out, r"lacks the entries \['<pad>'\]", "char.dic")


@pytest.mark.parametrize(
    "section, key, value, match, file",
    [
        ("encoder", "projection_dim", 12, r"has shape \(96, 16\), expected \(96, 12\)|expected \(12", "pkl"),
        ("encoder", "dim", 32, "expected", "encoder.pkl"),
        ("token_embedder", "filters", [[1, 4], [2, 4], [3, 9]], r"convolutions\.2\.weight has shape", "token_embedder"),
        ("token_embedder", "word_dim", 7, r"word_emb_layer\.embedding\.weight has shape", "token_embedder.pkl"),
    ],
)
def test_shapes_that_disagree_with_the_config_are_named(tmp_path, section, key, value, match, file):
    src, out = _copy("word", tmp_path)
    arch = json.loads((src / "arch.json").read_text())
    arch[section][key] = value
    (src / "arch.json").write_text(json.dumps(arch))
    _refused(src, out, match, file)


@pytest.mark.parametrize("section", ["token_embedder", "encoder"])
def test_the_lstm_variants_are_refused(tmp_path, section):
    src, out = _copy("word", tmp_path)
    arch = json.loads((src / "arch.json").read_text())
    arch[section]["name"] = "lstm"
    (src / "arch.json").write_text(json.dumps(arch))
    _refused(src, out, f"{section}.name is 'lstm'", "arch.json")


def test_a_pickle_that_runs_code_is_refused_before_anything_is_written(tmp_path):
    import os
    import pickle

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    src, out = _copy("word", tmp_path)
    (src / "encoder.pkl").write_bytes(pickle.dumps({"forward_layer_0.input_linearity.weight": Exploit()}, 2))
    _refused(src, out, "refused", "encoder.pkl")
    assert not (tmp_path / "pwned").exists()


def test_a_converted_vocabulary_with_a_malformed_line_is_named(converted, tmp_path):
    """options.json names its vocabularies relative to itself; a broken line stops the load naming file and line."""
    src, _ = converted["word"]
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    with open(out / "word_vocab.tsv", "a", encoding="utf-8") as f:
        f.write("lonely-word-without-id\n")
    n = len((out / "word_vocab.tsv").read_text("utf-8").splitlines())
    with pytest.raises(ElmoTFError, match=rf"word_vocab\.tsv:{n}: expected 'entry<TAB>id'") as e:
        load_elmo(out / "options.json", out / "weights.hdf5")
    assert "\n" not in str(e.value)
    shutil.copy(src / "word_vocab.tsv", out / "word_vocab.tsv")
    lines = (src / "char_vocab.tsv").read_text("utf-8").splitlines()
    (out / "char_vocab.tsv").write_text("\n".join(lines + [lines[0].split("\t")[0] + "\t3"]) + "\n", "utf-8")
    with pytest.raises(ElmoTFError, match=r"options\.json: char_cnn\.char_vocabulary must list each entry once"):
        load_elmo(out / "options.json", out / "weights.hdf5")


def test_the_embed_command_matches_elmoformanylangs(converted, tmp_path):
    """`elmo-tf embed --options OUTDIR/options.json --weights OUTDIR/weights.hdf5` on a text file, in process."""
    import h5py

    from elmo_tf.cli.embed import main

    out_dir, _ = converted["word"]
    text = tmp_path / "sentences.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in SENTENCES), "utf-8")
    out = tmp_path / "out.hdf5"
    argv = ["--options", str(out_dir / "options.json"), "--weights", str(out_dir / "weights.hdf5")]
    assert main([*argv, "--input", str(text), "--output", str(out), "--layers", "all"]) in (0, None)
    with h5py.File(out, "r") as f:
        got = [f[str(k)][...] for k in range(len(SENTENCES))]
    worst = _worst(got, _expected("word"))
    assert max(worst) <= ATOL, worst


@pytest.mark.parametrize("name", ["secret", "../secret", "ABS"])
def test_a_vocabulary_named_outside_the_options_dir_is_refused_unread(converted, tmp_path, name):
    """options.json comes from the internet with the weights: its vocabulary names must not reach any file of the
    machine (the first line of /etc/shadow in an error message, /dev/zero read until memory runs out)."""
    src, _ = converted["word"]
    out = tmp_path / "model"
    shutil.copytree(src, out)
    secret = tmp_path / "secret"
    secret.write_text("root:$6$saltsalt$hash\n")
    if name == "secret":  # a FIFO inside the dir: reading it would block forever
        os.mkfifo(out / "secret")
    options = json.loads((out / "options.json").read_text())
    options["char_cnn"]["char_vocabulary"] = str(secret) if name == "ABS" else name
    (out / "options.json").write_text(json.dumps(options))
    expected = r"secret: not a regular file" if name == "secret" else r"char_cnn\.char_vocabulary must name a file"
    with pytest.raises(ElmoTFError, match=expected) as e:
        load_elmo(out / "options.json", out / "weights.hdf5")
    assert "saltsalt" not in str(e.value) and "\n" not in str(e.value)
