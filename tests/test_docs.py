"""Every code block of README.md and docs/ runs, or is checked against what would run it (docs_testlib).

Python blocks run as written, in a directory holding the files they name (a tiny model saved under the names the
block uses); the ones that need a served export run in tests/serving/test_serving_docs.py, and three run in the
tests that cover them already (named in COVERED, which checks the block there is this one). Shell blocks: each
command line is parsed by the parser of the command it runs. YAML blocks parse; the package layout names real paths.
"""

import json
import re

import numpy as np
import pytest
import yaml
from docs_testlib import LANGUAGES, REPO_ROOT, all_blocks, check_command, code_blocks, doc_files, shell_commands
from tiny_models import TINY

# a distinctive line of a block -> the test that runs it elsewhere
COVERED = {
    'elmo = load_elmo("original")': "tests/test_readme.py::test_getting_a_model_runs_as_written",
    "char_ids = TokensToCharIds()(tokens)": "tests/test_readme.py::test_quickstart_runs_as_written",
    'model = elmo_tf.load_model("model.keras")': "tests/test_package.py::test_a_keras_file_loads_in_a_fresh_process_*",
    'with ElmoClient("localhost:8500", model_name="elmo", timeout=30) as client:': "tests/serving/test_serving_docs.py",
    'with ElmoClient("localhost:8500", model_name="elmo") as client:': "tests/serving/test_serving_docs.py",
    'elmo = ELMoSavedModel("models/elmo/1"': "tests/serving/test_serving_docs.py",
    # under the backend each names (make test: JAX; make test-torch: PyTorch)
    "class Tagger(torch.nn.Module):": "tests/backends/test_on_backend.py::test_readme_example_runs_as_written",
    "def train_step(trainable, non_trainable, char_ids, targets):": (
        "tests/backends/test_on_backend.py::test_readme_example_runs_as_written"
    ),
    'embedder = Embedder(elmo, layers="all")': "tests/backends/test_on_backend.py::test_the_embedder_example_runs",
}
README_COPIES = ('elmo = load_elmo("original")', "char_ids = TokensToCharIds()(tokens)")  # docs/ holds README's block


def harness_of(block):
    """The one key of HARNESSES or COVERED whose line the block holds."""
    keys = [key for key in (*HARNESSES, *COVERED) if key in block.code]
    assert len(keys) == 1, f"{block.where}: a Python block needs exactly one harness in tests/test_docs.py, has {keys}"
    return keys[0]


def save_tiny(directory, options="options.json", weights="weights.hdf5"):
    from elmo_tf import BiLMConfig, ELMo, save_elmo

    elmo = ELMo(BiLMConfig(**TINY))
    directory.mkdir(parents=True, exist_ok=True)
    save_elmo(elmo, str(directory))
    (directory / "options.json").rename(directory / options)
    (directory / "weights.hdf5").rename(directory / weights)
    return elmo


def run_block(code, where):
    namespace = {}
    exec(compile(code, where, "exec"), namespace)
    return namespace


def released_weights(tmp_path, block):
    """keras.md: the released files load under their own names, and save_elmo writes them again."""
    from elmo_tf import load_elmo

    prefix = "elmo_2x4096_512_2048cnn_2xhighway"
    save_tiny(tmp_path, f"{prefix}_options.json", f"{prefix}_weights.hdf5")
    namespace = run_block(block.code, block.where)
    again = load_elmo(str(tmp_path / "my_copy" / "options.json"), str(tmp_path / "my_copy" / "weights.hdf5"))
    for a, b in zip(namespace["elmo"].weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def tf_hub_mix(tmp_path, block):
    """converting.md: a converted TF Hub module's scalar_mix.json becomes a ScalarMix, and loads into the model's."""
    save_tiny(tmp_path / "hub_elmo")
    values = {"num_layers": TINY["num_layers"] + 1, "initial_weights": [0.5, -1.0, 2.0], "initial_gamma": 0.7}
    (tmp_path / "hub_elmo" / "scalar_mix.json").write_text(json.dumps(values))
    namespace = run_block(block.code, block.where)
    assert namespace["mix"].num_layers == values["num_layers"]
    mix = namespace["elmo"].scalar_mixes[0]
    np.testing.assert_allclose(mix.scalar_weights.numpy(), values["initial_weights"])
    np.testing.assert_allclose(mix.gamma.numpy(), values["initial_gamma"])


def beam_shards(tmp_path, block):
    """beam.md: open_shards reads beam-embed's shards (two written here as its workers write them)."""
    from elmo_tf.embed.output import write_embedding_file
    from elmo_tf.io.embeddings_shards import shard_path
    from elmo_tf.io.sentences import Sentence

    (tmp_path / "out").mkdir()
    rng = np.random.default_rng(0)
    arrays = {i: rng.normal(size=(3, i % 4, 8)).astype(np.float32) for i in range(20)}
    for shard, lines in enumerate((range(0, 10), range(10, 20))):
        embedded = [(Sentence(i, f"line {i}".encode(), [b"line", str(i).encode()], False), arrays[i]) for i in lines]
        write_embedding_file(shard_path(str(tmp_path / "out" / "emb"), shard, 2), embedded)
    namespace = run_block(block.code, block.where)
    np.testing.assert_array_equal(namespace["vectors"], arrays[12])
    assert namespace["index"] == {f"line {i}": str(i) for i in range(20)}


def language_model(tmp_path, block):
    """pretraining.md: a biLM with its softmax and vocabulary scores tokens."""
    import h5py

    from elmo_tf import BiLMConfig
    from elmo_tf.io import save_bilm_weights
    from elmo_tf.models import LanguageModel

    words = ["</S>", "<S>", "<UNK>", "The", "cat", "sat", "."]
    config = BiLMConfig(**TINY)
    lm = LanguageModel(config, len(words))
    config.to_json(tmp_path / "options.json")
    save_bilm_weights(lm, tmp_path / "weights.hdf5")
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    rng = np.random.default_rng(1)
    with h5py.File(tmp_path / "softmax.hdf5", "w") as f:
        f["softmax/W"] = rng.normal(size=(len(words), TINY["projection_dim"])).astype(np.float32)
        f["softmax/b"] = rng.normal(size=len(words)).astype(np.float32)
    out = run_block(block.code, block.where)["out"]
    assert out["forward_log_probs"].shape == (1, 5)  # as the block's comment says
    assert out["forward_top_k_words"].shape == (1, 5, 5)


HARNESSES = {
    'elmo = load_elmo("elmo_2x4096_512_2048cnn_2xhighway_options.json"': released_weights,
    'mix = ScalarMix(**json.load(open("hub_elmo/scalar_mix.json")))': tf_hub_mix,
    'with open_shards("out/emb") as shards:': beam_shards,
    'lm = load_language_model("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt", top_k=5)': language_model,
}


def test_every_block_has_a_language_the_tests_check():
    unknown = [f"{b.where}: {b.language or '(none)'}" for b in all_blocks() if b.language not in LANGUAGES]
    assert unknown == []


def test_every_python_block_has_a_harness():
    used = {harness_of(block) for block in all_blocks("python")}
    assert used == set(HARNESSES) | set(COVERED), set(HARNESSES) | set(COVERED) - used  # no harness left unused


def test_the_docs_copies_of_readme_blocks_are_readme_blocks():
    readme = {b.code for b in code_blocks(REPO_ROOT / "README.md") if b.language == "python"}
    for block in all_blocks("python"):
        if harness_of(block) in README_COPIES:
            assert block.code in readme, f"{block.where} differs from README.md's block (tests/test_readme.py runs it)"


@pytest.mark.parametrize("key", sorted(HARNESSES))
def test_python_block_runs(key, tmp_path, monkeypatch):
    blocks = [b for b in all_blocks("python") if key in b.code]
    assert blocks, f"no block holds {key!r}"
    for block in blocks:
        directory = tmp_path / block.path.stem / str(block.line)
        directory.mkdir(parents=True)
        monkeypatch.chdir(directory)
        HARNESSES[key](directory, block)


@pytest.mark.parametrize("block", all_blocks("bash"), ids=lambda b: b.where)
def test_shell_commands_parse(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the placeholders of the files the commands name go here
    commands = shell_commands(block.code)
    assert commands, f"{block.where}: an empty shell block"
    for tokens in commands:
        check_command(tokens)


@pytest.mark.parametrize("block", all_blocks("yaml"), ids=lambda b: b.where)
def test_yaml_blocks_parse(block):
    assert yaml.safe_load(block.code)


def test_the_layout_names_real_paths():
    (layout,) = [b for b in all_blocks("text") if b.code.startswith("elmo_tf/")]
    top = [line.split()[0] for line in layout.code.splitlines() if line[:1].strip()]
    nested = [line.split()[0] for line in layout.code.splitlines() if re.match(r"  \w", line)]
    assert {"elmo_tf/", "tests/", "docs/", "bench/"} <= set(top)
    missing = [p for p in top if not (REPO_ROOT / p).exists()]
    missing += [p for p in nested if not (REPO_ROOT / "elmo_tf" / p).exists()]
    assert missing == []


def test_the_docs_name_no_stale_table():
    stale = [
        f"{path.relative_to(REPO_ROOT)}:{n}"
        for path in [*doc_files(), REPO_ROOT / "bench" / "README.md"]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"predates|still to be made", line, flags=re.I)
    ]
    assert stale == []


def test_a_wrong_flag_in_a_block_is_caught(tmp_path, monkeypatch):
    """The check of shell blocks can fail: a misspelt flag, a wrong value type, an unknown subcommand's script."""
    monkeypatch.chdir(tmp_path)
    for command in (
        "elmo-tf embed --options o.json --weights w.hdf5 --input in.txt --output out.hdf5 --batch-sise 64",
        "elmo-tf embed --options o.json --weights w.hdf5 --input in.txt --output out.hdf5 --batch-size many",
        "python serving/serve.py --model_base_path /m --model_name elmo --no_such_stock_flag=1",
        "tensorflow_model_server --port=eighty",
        "make no-such-target",
        "elmo-tf pretrain ... --no-such-flag 3",
        "wget http://example.com/x",
    ):
        (tokens,) = shell_commands(command)
        with pytest.raises(AssertionError):
            check_command(tokens)


def test_the_reference_covers_every_public_package_and_module():
    """elmo_tf._reference lists a page per public package and module (docs/gen_ref_pages.py renders them); a new one
    must be added there (or to NOT_DOCUMENTED with its reason). `mkdocs build --strict` (make docs) fails on a name it
    cannot render."""
    import pkgutil

    import elmo_tf
    from elmo_tf import _reference as reference

    public = {
        f"elmo_tf.{info.name}" for info in pkgutil.iter_modules(elmo_tf.__path__) if not info.name.startswith("_")
    }
    assert public - set(reference.PACKAGES) - set(reference.NOT_DOCUMENTED) == set()
    assert set(reference.PACKAGES) - public - {"elmo_tf"} == set()
    entries = reference.reference_entries()
    for package, rendered in entries.items():
        names = {name for name, _path, _here in rendered}
        assert names == set(reference.public_names(package)), package
    # each name is rendered on exactly one page
    homes = {}
    for package, rendered in entries.items():
        for _name, path, here in rendered:
            homes.setdefault(path, []).extend([package] if here else [])
    assert {path: where for path, where in homes.items() if len(where) != 1} == {}
