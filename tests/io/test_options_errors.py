"""elmo_tf/config.py: a bad options.json raises `ConfigError` (a ValueError) naming the file, the key path and
the value received: wrong types, lists for objects, out-of-range sizes, missing keys, invalid JSON, not UTF-8."""

import codecs
import json

import pytest

from elmo_tf.config import BiLMConfig, ConfigError
from elmo_tf.models import load_elmo


@pytest.fixture
def options(tiny_config):
    return tiny_config.to_options()


def set_key(options, path, value):
    *parents, last = path.split(".")
    node = options
    for part in parents:
        node = node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return options


DELETE = object()
PAIR = "ints 1 <= width <= 50 and num_filters >= 1"

# (key path, value to put there, what the message must contain after "<file>: ")
BAD_VALUES = [
    ("lstm.dim", "4096", "lstm.dim must be a positive int, got '4096'"),
    ("lstm.dim", 4096.0, "lstm.dim must be a positive int, got 4096.0"),
    ("lstm.dim", None, "lstm.dim must be a positive int, got None"),
    ("lstm.projection_dim", -8, "lstm.projection_dim must be a positive int, got -8"),
    ("lstm.n_layers", 0, "lstm.n_layers must be a positive int, got 0"),
    ("lstm.n_layers", True, "lstm.n_layers must be a positive int, got True"),
    ("lstm.cell_clip", "3", "lstm.cell_clip must be null/None or a number >= 0, got '3'"),
    ("lstm.proj_clip", -1, "lstm.proj_clip must be null/None or a number >= 0, got -1"),
    ("lstm.proj_clip", float("nan"), "lstm.proj_clip must be null/None or a number >= 0, got nan"),
    ("lstm.use_skip_connections", "yes", "lstm.use_skip_connections must be true or false, got 'yes'"),
    ("lstm", [16, 8, 2], "lstm must be an object ({...}), got list [16, 8, 2]"),
    ("lstm", None, "lstm must be an object ({...}), got NoneType None"),
    ("char_cnn.embedding", [4], "char_cnn.embedding must be an object ({...}), got list [4]"),
    ("char_cnn.embedding.dim", {"dim": 4}, "char_cnn.embedding.dim must be a positive int, got {'dim': 4}"),
    ("char_cnn.filters", "[[1, 4]]", "char_cnn.filters must be a list of [width, num_filters] pairs, got '[[1, 4]]'"),
    ("char_cnn.filters", [], "char_cnn.filters must list at least one [width, num_filters] pair, got []"),
    ("char_cnn.filters", [[1, 4], [2]], "char_cnn.filters[1] must be a [width, num_filters] pair, got [2]"),
    ("char_cnn.filters", [[1, "4"]], "char_cnn.filters[0] must be [width, num_filters] with ints 1 <= width <= 50"),
    ("char_cnn.filters", [[60, 4]], f"char_cnn.filters[0] must be [width, num_filters] with {PAIR}, got [60, 4]"),
    ("char_cnn.filters", [[1, 4], [1, 0]], f"char_cnn.filters[1] must be [width, num_filters] with {PAIR}, got [1, 0]"),
    ("char_cnn.n_highway", -1, "char_cnn.n_highway must be a non-negative int, got -1"),
    ("char_cnn.n_highway", 2**31, "char_cnn.n_highway must be <= 16 (elmo_tf's ceiling, far above any released"),
    ("lstm.dim", 10**12, "lstm.dim must be <= 65536 (elmo_tf's ceiling, far above any released ELMo), got 1000000"),
    ("char_cnn.filters", [[1, 2**31]], "char_cnn.filters[0] num_filters must be <= 65536 (elmo_tf's ceiling, far"),
    ("char_cnn.n_highway", "2", "char_cnn.n_highway must be a non-negative int, got '2'"),
    ("char_cnn.activation", "gelu", "char_cnn.activation must be 'relu' or 'tanh', got 'gelu'"),
    ("char_cnn.activation", ["relu"], "char_cnn.activation must be 'relu' or 'tanh', got ['relu']"),
    ("char_cnn.n_characters", 261, "char_cnn.n_characters is 261 (bilm-tf's training value): set it to 262"),
    ("char_cnn.n_characters", "262", "char_cnn.n_characters must be 262, got '262'"),
    ("char_cnn.max_characters_per_token", 49, "char_cnn.max_characters_per_token must be 50"),
    ("lstm.n_layers", DELETE, "lstm.n_layers is missing (bilm-tf options.json needs"),
    ("char_cnn.embedding", DELETE, "char_cnn.embedding.dim is missing"),
    ("lstm", DELETE, "lstm.dim is missing"),
    ("char_cnn", DELETE, "char_cnn is missing: only character-input biLMs are supported"),
]


def _case_id(path, value):
    """A test id that is the same in every process (xdist workers compare them): no object address."""
    return f"{path}={'<deleted>' if value is DELETE else repr(value)}"[:40]


@pytest.mark.parametrize("path,value,needle", BAD_VALUES, ids=[_case_id(p, v) for p, v, _ in BAD_VALUES])
def test_bad_values_name_the_file_the_key_and_the_value(options, tmp_path, path, value, needle):
    file = tmp_path / "options.json"
    file.write_text(json.dumps(set_key(options, path, value)), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        BiLMConfig.from_json(file)
    message = str(info.value)
    assert message.startswith(f"{file}: {needle}"), message
    assert "\n" not in message and isinstance(info.value, ValueError)
    with pytest.raises(ConfigError, match="options.json: "):  # load_elmo: the same error, before building
        load_elmo(file)


def test_the_example_of_the_issue(options, tmp_path):
    file = tmp_path / "options.json"
    file.write_text(json.dumps(set_key(options, "lstm.dim", "4096")))
    with pytest.raises(ConfigError) as info:
        BiLMConfig.from_json(file)
    assert str(info.value) == f"{file}: lstm.dim must be a positive int, got '4096'"
    assert (info.value.key, info.value.source) == ("lstm.dim", str(file))


def test_from_options_without_a_file_and_dataclass_fields(options):
    with pytest.raises(ConfigError, match=r"^lstm\.dim must be a positive int, got '4096'$"):
        BiLMConfig.from_options(set_key(options, "lstm.dim", "4096"))
    with pytest.raises(ConfigError, match=r"^must hold a JSON object .* got list \[1, 2\]$"):
        BiLMConfig.from_options([1, 2])
    with pytest.raises(ConfigError, match=r"^lstm_dim must be a positive int, got '4096'$"):
        BiLMConfig(lstm_dim="4096")
    with pytest.raises(ConfigError, match=r"^filters\[0\] must be"):
        BiLMConfig(filters=(("a", 4),))
    with pytest.raises(ConfigError, match=r"^cell_clip must be"):
        BiLMConfig(cell_clip="3")


def test_valid_variants_are_accepted(options, tiny_config):
    # optional keys absent, null clips, ints for clips, extra training keys: all as released files have them
    for path in ("char_cnn.n_highway", "char_cnn.activation", "char_cnn.n_characters", "lstm.use_skip_connections"):
        set_key(options, path, DELETE)
    options["lstm"]["cell_clip"], options["lstm"]["proj_clip"] = None, 3
    options.update(n_epochs=10, dropout=0.1, bidirectional=True, n_tokens_vocab=793471)
    config = BiLMConfig.from_options(options)
    assert (config.num_highway, config.activation, config.use_skip_connections) == (0, "relu", False)
    assert (config.cell_clip, config.proj_clip, config.filters) == (None, 3, tiny_config.filters)


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"", ": is empty; expected bilm-tf's options.json"),
        (b" \n\n", ": is empty"),
        (b'{"lstm": {"dim": 16,}\n}', ":1: not valid JSON: Expecting property name enclosed in double quotes"),
        (b'{\n  "lstm": {"dim": 16},\n  oops\n}', ":3: not valid JSON: Expecting property name"),
        (b'[\n"caf\xe9"]', ":2: invalid UTF-8 (byte 0xe9 at byte offset 6)"),
        ('{"lstm": {}}'.encode("utf-16"), ":1: starts with a UTF-16/UTF-32 byte order mark"),
        (b"\x89HDF\r\n\x1a\n\x00\x00", ":1: invalid UTF-8 (byte 0x89 at byte offset 0)"),  # weights as options
        (b'{"lstm":\n\x00}', ":2: NUL byte at byte offset 9"),
    ],
    ids=["empty", "blank", "trailing-comma", "bare-word", "latin1", "utf16", "hdf5", "nul"],
)
def test_unreadable_files_name_the_file_and_line(tmp_path, data, needle):
    file = tmp_path / "options.json"
    file.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_elmo(file)
    assert str(info.value).startswith(f"{file}{needle}"), str(info.value)
    assert "\n" not in str(info.value)


def test_a_utf8_bom_and_crlf_are_accepted(options, tiny_config, tmp_path):
    file = tmp_path / "options.json"
    file.write_bytes(codecs.BOM_UTF8 + json.dumps(options, indent=2).replace("\n", "\r\n").encode())
    assert BiLMConfig.from_json(file) == tiny_config


def test_a_directory_and_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory, not a file$"):
        BiLMConfig.from_json(tmp_path)
    with pytest.raises(ConfigError, match=r"nope\.json: No such file or directory$"):
        load_elmo(tmp_path / "nope.json")


def test_to_json_is_atomic_and_replaces(tiny_config, tmp_path):
    file = tmp_path / "options.json"
    file.write_text("old")
    (tmp_path / ".options.json.tmp-999999999-0123abcd").write_text("left by a killed run")
    tiny_config.to_json(file)
    assert BiLMConfig.from_json(file) == tiny_config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["options.json"]
