"""`BiLMConfig`: the architecture of a biLM, validated once, convertible to and from bilm-tf's options.json."""

import dataclasses
import json
import math
import os

from elmo_tf.bounds import (  # noqa: F401 (ConfigError, config_field, field_flag, ...: long imported from here too)
    INT32_MAX,
    INT64_MAX,
    SEED_MAX,
    Bounds,
    ConfigError,
    _is_int,
    _is_number,
    _show,
    check_bounds,
    config_field,
    field_flag,
)
from elmo_tf.preprocessing.char_rows import CHAR_SPECIALS, WORD_SPECIALS
from elmo_tf.preprocessing.chars import MAX_CHARS, NUM_CHAR_IDS

# field of BiLMConfig -> (key path in options.json, required, default when absent)
OPTION_KEYS = {
    "char_embedding_dim": ("char_cnn.embedding.dim", True, None),
    "filters": ("char_cnn.filters", True, None),
    "num_highway": ("char_cnn.n_highway", False, 0),
    "activation": ("char_cnn.activation", False, "relu"),
    "max_characters_per_token": ("char_cnn.max_characters_per_token", False, MAX_CHARS),
    "num_characters": ("char_cnn.n_characters", False, NUM_CHAR_IDS),
    "lstm_dim": ("lstm.dim", True, None),
    "projection_dim": ("lstm.projection_dim", True, None),
    "num_layers": ("lstm.n_layers", True, None),
    "cell_clip": ("lstm.cell_clip", False, None),
    "proj_clip": ("lstm.proj_clip", False, None),
    "use_skip_connections": ("lstm.use_skip_connections", False, False),
    # ELMoForManyLangs' numerics (elmo_tf.preprocessing.char_vocabulary); absent in bilm-tf files
    "char_vocabulary": ("char_cnn.char_vocabulary", False, None),
    "char_special_ids": ("char_cnn.special_ids", False, None),
    "word_embedding_dim": ("char_cnn.word_embedding.dim", False, 0),
    "word_vocabulary": ("char_cnn.word_embedding.vocabulary", False, None),
    "word_special_ids": ("char_cnn.word_embedding.special_ids", False, None),
    "num_words": ("char_cnn.word_embedding.n_words", False, 0),
    "always_project": ("char_cnn.always_project", False, False),
}
VOCABULARY_FILES = {"char_vocabulary": "char_vocab.tsv", "word_vocabulary": "word_vocab.tsv"}

# The ceilings of a biLM's sizes, checked from the options alone, before anything is built: an options.json from the
# internet must not make the layers allocate and randomly initialise tens of GB (lstm.dim 10**9) or build layers for
# minutes (lstm.n_layers 10**6). Far above any released ELMo: the original has LSTM 4096, projection 512, 2 layers,
# 7 filter widths of 2048 filters in all, 2 highway layers, 93.6M parameters; ELMoForManyLangs' models are smaller;
# the largest LSTM language models of that line (Jozefowicz et al. 2016) are 8192 wide with projections of 1024.
MAX_DIM = 2**16  # lstm.dim, lstm.projection_dim, the char and word embedding dims, each filter count: 16x 4096
MAX_LAYERS = 32  # lstm.n_layers: 16x the original's 2
MAX_HIGHWAY = 16  # char_cnn.n_highway: 8x the original's 2
MAX_FILTER_WIDTHS = 64  # entries of char_cnn.filters: the original has 7
MAX_PARAMETERS = 2**31  # every weight of the char CNN and both LSTM stacks: 8 GiB of float32, 23x the original's
_SIZE_NOTE = "elmo_tf's ceiling, far above any released ELMo"
_CEILINGS = {  # field -> (lowest, highest)
    "char_embedding_dim": (1, MAX_DIM),
    "lstm_dim": (1, MAX_DIM),
    "projection_dim": (1, MAX_DIM),
    "num_layers": (1, MAX_LAYERS),
    "num_highway": (0, MAX_HIGHWAY),
}
_REQUIRED = ", ".join(path for path, required, _ in OPTION_KEYS.values() if required)


def _read_vocabulary(name, source, field):
    """The pairs of the vocabulary file `name`, which must lie in the options file's directory or below it: an
    options.json from the internet must not make us read any other file (a device, someone's secrets)."""
    from elmo_tf.io.entry_ids import read_entry_ids  # here: elmo_tf.io imports this module

    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or ".." in parts or "\0" in name:
        raise ConfigError(
            f"must name a file beside the options file (or below it), got {_show(name)}", OPTION_KEYS[field][0], source
        )
    base = os.path.dirname(source) if source else ""
    return read_entry_ids(os.path.join(base, name))


def _entry_ids(value, rows, key):
    """`value` ({entry: id} or [[entry, id], ...]) as a tuple of (entry, id) pairs sorted by id, ids in [0, rows)."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
        raise ConfigError(f"must map entries to ids ({{entry: id}}), got {_show(value)}", key)
    out = []
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ConfigError(f"must hold (entry, id) pairs, got {_show(pair)}", key)
        entry, i = pair
        if not isinstance(entry, str) or not _is_int(i) or not 0 <= i < rows:
            raise ConfigError(f"must map a string to an id in [0, {rows}), got {_show(entry)}: {_show(i)}", key)
        out.append((entry, int(i)))
    if not out:
        raise ConfigError("must not be empty", key)
    seen = set()
    for entry, _ in out:
        if entry in seen:
            raise ConfigError(f"must list each entry once, got {_show(entry)} twice", key)
        seen.add(entry)
    return tuple(sorted(out, key=lambda p: (p[1], p[0])))


def _special_ids(value, names, rows, key):
    """`value` ({name: id} for every name of `names`) as a tuple of (name, id) pairs in `names`' order."""
    if not isinstance(value, dict):
        value = dict(value) if isinstance(value, (tuple, list)) else value
    if not isinstance(value, dict) or sorted(value) != sorted(names):
        raise ConfigError(f"must give the ids of {list(names)}, got {_show(value)}", key)
    for name in names:
        if not _is_int(value[name]) or not 0 <= value[name] < rows:
            raise ConfigError(f"{name} must be an id in [0, {rows}), got {_show(value[name])}", key)
    return tuple((name, int(value[name])) for name in names)


def _check_parameter_count(config):
    """Raises `ConfigError` when `config` would hold more than `MAX_PARAMETERS` weights."""
    parts = config.parameter_parts()
    total = sum(parts.values())
    if total <= MAX_PARAMETERS:
        return
    field = max(parts, key=parts.get)  # named: the field that sizes the largest part
    value = f"{config.num_filters} filters in all" if field == "filters" else getattr(config, field)
    raise ConfigError(
        f"is {value}: the biLM would hold {total:,} weights ({parts[field]:,} in the part it sizes), more than "
        f"{MAX_PARAMETERS:,} (8 GiB of float32; {_SIZE_NOTE})",
        field,
    )


def _check_byte_characters(config):
    """Checks `num_characters` for bilm-tf's byte mapping (no char vocabulary)."""
    if config.num_characters == NUM_CHAR_IDS - 1 and _is_int(config.num_characters):
        raise ConfigError(
            "is 261 (bilm-tf's training value): set it to 262 for a trained model; "
            "the weight file's 261 rows get a zero padding row prepended at load time",
            "num_characters",
        )
    if not _is_int(config.num_characters) or config.num_characters != NUM_CHAR_IDS:
        raise ConfigError(f"must be {NUM_CHAR_IDS}, got {_show(config.num_characters)}", "num_characters")


def _check_vocabularies(config, put):
    """Checks and normalises (through `put`) ELMoForManyLangs' vocabularies, special ids and word embedding."""
    rows = config.num_characters
    if not _is_int(rows) or rows < 2 or rows > INT32_MAX:
        raise ConfigError(f"must be an int >= 2 (the char vocabulary's rows + 1), got {_show(rows)}", "num_characters")
    put("char_vocabulary", _entry_ids(config.char_vocabulary, rows - 1, "char_vocabulary"))
    put("char_special_ids", _special_ids(config.char_special_ids, CHAR_SPECIALS, rows - 1, "char_special_ids"))
    dim = config.word_embedding_dim
    if not _is_int(dim) or dim < 0:
        raise ConfigError(f"must be a non-negative int, got {_show(dim)}", "word_embedding_dim")
    if dim > MAX_DIM:
        raise ConfigError(f"must be <= {MAX_DIM} ({_SIZE_NOTE}), got {_show(dim)}", "word_embedding_dim")
    if dim == 0:
        if config.word_vocabulary is not None or config.word_special_ids is not None:
            raise ConfigError("must be > 0 with a word vocabulary", "word_embedding_dim")
        put("num_words", 0)
        return
    words = config.num_words
    if not _is_int(words) or words < 1 or words > INT32_MAX:
        raise ConfigError(f"must be a positive int (the word embedding's rows), got {_show(words)}", "num_words")
    put("word_vocabulary", _entry_ids(config.word_vocabulary, words, "word_vocabulary"))
    put("word_special_ids", _special_ids(config.word_special_ids, WORD_SPECIALS, words, "word_special_ids"))


def _check_filters(config, put):
    """Checks `filters` and stores it (through `put`) as a tuple of (width, num_filters) int pairs."""
    filters = config.filters
    if isinstance(filters, (str, bytes, dict)) or not hasattr(filters, "__iter__"):
        raise ConfigError(f"must be a list of [width, num_filters] pairs, got {_show(filters)}", "filters")
    if hasattr(filters, "__len__") and len(filters) > MAX_FILTER_WIDTHS:  # before walking a list of 10**7
        raise ConfigError(
            f"must list at most {MAX_FILTER_WIDTHS} [width, num_filters] pairs ({_SIZE_NOTE}), got {len(filters)}",
            "filters",
        )
    filters = list(filters)
    if not filters:
        raise ConfigError("must list at least one [width, num_filters] pair, got []", "filters")
    pairs = []
    for k, pair in enumerate(filters):
        if isinstance(pair, (str, bytes, dict)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ConfigError(f"must be a [width, num_filters] pair, got {_show(pair)}", f"filters[{k}]")
        width, n = pair
        if _is_int(n) and n > MAX_DIM:
            raise ConfigError(f"num_filters must be <= {MAX_DIM} ({_SIZE_NOTE}), got {_show(pair)}", f"filters[{k}]")
        if not (_is_int(width) and _is_int(n) and 1 <= width <= config.max_characters_per_token and n >= 1):
            raise ConfigError(
                f"must be [width, num_filters] with ints 1 <= width <= {config.max_characters_per_token} "
                f"and num_filters >= 1, got {_show(pair)}",
                f"filters[{k}]",
            )
        pairs.append((int(width), int(n)))
    put("filters", tuple(pairs))


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """Architecture of an ELMo biLM (char CNN + LSTM stacks). Field names follow bilm-tf's options.json.

    `num_characters` is the number of rows of the char embedding in the model (262: a zero padding row
    plus the 261 rows stored in the weight file), as released options.json files say.

    Raises:
        ConfigError (a ValueError): a field of the wrong type or out of range, naming the field and the value.
    """

    char_embedding_dim: int = 16
    filters: tuple = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    num_highway: int = 2
    activation: str = "relu"
    max_characters_per_token: int = MAX_CHARS
    num_characters: int = NUM_CHAR_IDS
    lstm_dim: int = 4096
    projection_dim: int = 512
    num_layers: int = 2
    cell_clip: float = 3.0
    proj_clip: float = 3.0
    use_skip_connections: bool = True
    # ELMoForManyLangs (elmo_tf.preprocessing.char_vocabulary): None/0/False for bilm-tf's byte mapping
    char_vocabulary: tuple = None
    char_special_ids: tuple = None
    word_embedding_dim: int = 0
    word_vocabulary: tuple = None
    word_special_ids: tuple = None
    num_words: int = 0
    always_project: bool = False

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        for name, (low, high) in _CEILINGS.items():
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                sign = "non-negative" if low == 0 else "positive"
                raise ConfigError(f"must be a {sign} int, got {_show(value)}", name)
            if value > high:
                raise ConfigError(f"must be <= {high} ({_SIZE_NOTE}), got {_show(value)}", name)
            put(name, int(value))
        if not _is_int(self.max_characters_per_token) or self.max_characters_per_token != MAX_CHARS:
            raise ConfigError(
                f"must be {MAX_CHARS} (the char mapping's width), got {_show(self.max_characters_per_token)}",
                "max_characters_per_token",
            )
        _check_filters(self, put)
        if self.always_project not in (True, False) or not isinstance(self.always_project, (bool, int)):
            raise ConfigError(f"must be true or false, got {_show(self.always_project)}", "always_project")
        put("always_project", bool(self.always_project))
        if self.char_vocabulary is not None:
            _check_vocabularies(self, put)
        elif any((self.char_special_ids, self.word_embedding_dim, self.word_vocabulary, self.word_special_ids)):
            raise ConfigError("is needed by special ids and a word embedding (ELMoForManyLangs)", "char_vocabulary")
        else:
            _check_byte_characters(self)
        if not isinstance(self.activation, str) or self.activation not in ("relu", "tanh"):
            raise ConfigError(f"must be 'relu' or 'tanh', got {_show(self.activation)}", "activation")
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not math.isfinite(value) or value < 0):
                raise ConfigError(f"must be null/None or a number >= 0, got {_show(value)}", name)
        if self.use_skip_connections not in (True, False) or not isinstance(self.use_skip_connections, (bool, int)):
            raise ConfigError(f"must be true or false, got {_show(self.use_skip_connections)}", "use_skip_connections")
        put("use_skip_connections", bool(self.use_skip_connections))
        _check_parameter_count(self)

    def parameter_parts(self):
        """`{field: weights}` of the biLM these options describe, by the field that sizes each part most: "lstm_dim"
        (both LSTM stacks), "filters" (convolutions, highway, projection), "num_characters" (the char embedding),
        "num_words" (ELMoForManyLangs' word embedding). Computed from the options alone (Python ints, nothing
        built); `sum(...)` is the model's count of char CNN and biLM weights."""
        embed, filters = self.char_embedding_dim, self.num_filters
        token_dim = filters + self.word_embedding_dim  # what the projection reads
        convolutions = sum(width * embed * n + n for width, n in self.filters)
        cnn = convolutions + self.num_highway * 2 * (filters * filters + filters)  # carry and transform
        if self.always_project or token_dim != self.projection_dim:
            cnn += token_dim * self.projection_dim + self.projection_dim
        dim, projection = self.lstm_dim, self.projection_dim
        lstm = 2 * self.num_layers * (2 * projection * 4 * dim + 4 * dim + dim * projection)
        words = (self.num_words + 1) * self.word_embedding_dim if self.word_embedding_dim else 0
        return {"lstm_dim": lstm, "filters": cnn, "num_characters": self.num_characters * embed, "num_words": words}

    def multiply_adds_per_position(self):
        """Multiply-adds one token position costs the char CNN and both LSTM stacks (inference; the convolutions at
        each of the token's `max_characters_per_token` char positions, every other weight once): what bounds the
        positions of one model call (`elmo_tf.embed.packing.default_batch_tokens`)."""
        parts = self.parameter_parts()
        convolutions = sum(width * self.char_embedding_dim * n for width, n in self.filters)
        return parts["lstm_dim"] + parts["filters"] + convolutions * (self.max_characters_per_token - 1)

    @property
    def num_filters(self):
        return sum(n for _, n in self.filters)

    @classmethod
    def from_options(cls, options, source=None):
        """From a bilm-tf options dict (`{"lstm": {...}, "char_cnn": {...}}`; other keys are ignored).

        Args:
            options: the parsed options.json.
            source: the file it came from, to start error messages with.
        Raises:
            ConfigError: naming `source` and the key path (`lstm.dim`) with the value received: a missing key,
                a section that is not an object, a value of the wrong type or out of range.
        """
        if not isinstance(options, dict):
            raise ConfigError(
                f"must hold a JSON object with 'lstm' and 'char_cnn' sections, got {type(options).__name__} "
                f"{_show(options)}",
                source=source,
            )
        if "char_cnn" not in options:
            raise ConfigError(
                "is missing: only character-input biLMs are supported (bilm-tf options.json with a char_cnn section)",
                "char_cnn",
                source,
            )
        kwargs = {}
        for field, (path, required, default) in OPTION_KEYS.items():
            node, parts = options, path.split(".")
            for depth, part in enumerate(parts):
                if not isinstance(node, dict):
                    got = f"{type(node).__name__} {_show(node)}"
                    raise ConfigError(f"must be an object ({{...}}), got {got}", ".".join(parts[:depth]), source)
                if part not in node:
                    node = default
                    if required:
                        raise ConfigError(f"is missing (bilm-tf options.json needs {_REQUIRED})", path, source)
                    break
                node = node[part]
            kwargs[field] = node
        for field in VOCABULARY_FILES:
            if isinstance(kwargs[field], str):  # a file named relative to the options file
                kwargs[field] = _read_vocabulary(kwargs[field], source, field)
        try:
            return cls(**kwargs)
        except ConfigError as e:
            field, _, index = e.key.partition("[")
            path = OPTION_KEYS[field][0] + (f"[{index}" if index else "")
            raise ConfigError(e.problem, path, source) from None

    @classmethod
    def from_json(cls, path):
        """From a bilm-tf/AllenNLP options.json (UTF-8).

        Raises:
            ConfigError: naming the file (and the line, or the key path): a missing file or a directory, a file
                that is not UTF-8 text or not JSON, a missing key or a value of the wrong type or range.
        """
        from elmo_tf.io.text import TextFileError, read_text  # here: elmo_tf.io imports this module

        try:
            text = read_text(path)
        except TextFileError as e:
            raise ConfigError(str(e)) from None
        if not text.strip():
            raise ConfigError("is empty; expected bilm-tf's options.json", source=str(path))
        try:
            options = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON: {e.msg} (column {e.colno})", source=f"{path}:{e.lineno}") from None
        except RecursionError:
            raise ConfigError("not valid JSON: nested too deeply", source=str(path)) from None
        return cls.from_options(options, source=str(path))

    def to_options(self):
        """The bilm-tf/AllenNLP options dict for this architecture (plus ELMoForManyLangs' keys when set)."""
        options = {
            "lstm": {
                "dim": self.lstm_dim,
                "projection_dim": self.projection_dim,
                "n_layers": self.num_layers,
                "cell_clip": self.cell_clip,
                "proj_clip": self.proj_clip,
                "use_skip_connections": self.use_skip_connections,
            },
            "char_cnn": {
                "embedding": {"dim": self.char_embedding_dim},
                "filters": [list(f) for f in self.filters],
                "n_highway": self.num_highway,
                "activation": self.activation,
                "max_characters_per_token": self.max_characters_per_token,
                "n_characters": self.num_characters,
            },
        }
        cnn = options["char_cnn"]
        if self.always_project:
            cnn["always_project"] = True
        if self.char_vocabulary is not None:  # inline here; to_json writes them to files beside options.json
            cnn["char_vocabulary"] = dict(self.char_vocabulary)
            cnn["special_ids"] = dict(self.char_special_ids)
        if self.word_embedding_dim:
            cnn["word_embedding"] = {
                "dim": self.word_embedding_dim,
                "n_words": self.num_words,
                "vocabulary": dict(self.word_vocabulary),
                "special_ids": dict(self.word_special_ids),
            }
        return options

    def to_json(self, path):
        """Writes `to_options()` as JSON, atomically (a temporary file renamed over `path`); the char and word
        vocabularies, if any, go to `char_vocab.tsv` / `word_vocab.tsv` beside it (`entry<TAB>id` lines), which the
        file names. Returns the paths written."""
        from elmo_tf.io.atomic import write_json, write_text  # here: elmo_tf.io imports this module
        from elmo_tf.io.entry_ids import entry_ids_text

        options, written = self.to_options(), []
        for field, name in VOCABULARY_FILES.items():
            pairs = getattr(self, field)
            if pairs is None:
                continue
            target = os.path.join(os.path.dirname(os.fspath(path)), name)
            write_text(target, entry_ids_text(pairs))
            written.append(target)
            if field == "char_vocabulary":
                options["char_cnn"]["char_vocabulary"] = name
            else:
                options["char_cnn"]["word_embedding"]["vocabulary"] = name
        write_json(path, options)
        return [*written, os.fspath(path)]


PRESETS = {
    "original": BiLMConfig(),
    "medium": BiLMConfig(num_highway=1, lstm_dim=2048, projection_dim=256),
    "small": BiLMConfig(num_highway=1, lstm_dim=1024, projection_dim=128),
}


def get_config(name):
    """A preset ("small", "medium", "original") by name."""
    if name not in PRESETS:
        raise ConfigError(f"unknown config {name!r}: choose one of {sorted(PRESETS)} or pass an options.json")
    return PRESETS[name]
