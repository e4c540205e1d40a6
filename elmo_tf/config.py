"""`BiLMConfig`: the architecture of a biLM, validated once, convertible to and from bilm-tf's options.json."""

import dataclasses
import json

from elmo_tf.preprocessing.chars import MAX_CHARS, NUM_CHAR_IDS


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """Architecture of an ELMo biLM (char CNN + LSTM stacks). Field names follow bilm-tf's options.json.

    `num_characters` is the number of rows of the char embedding in the model (262: a zero padding row
    plus the 261 rows stored in the weight file), as released options.json files say.
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

    def __post_init__(self):
        object.__setattr__(self, "filters", tuple((int(w), int(n)) for w, n in self.filters))
        for name in ("char_embedding_dim", "lstm_dim", "projection_dim", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.num_highway, int) or self.num_highway < 0:
            raise ValueError(f"num_highway must be a non-negative int, got {self.num_highway!r}")
        if not self.filters:
            raise ValueError("filters must list at least one (width, num_filters) pair, got []")
        if self.max_characters_per_token != MAX_CHARS:
            raise ValueError(
                f"max_characters_per_token must be {MAX_CHARS} (the char mapping's width), "
                f"got {self.max_characters_per_token!r}"
            )
        if self.num_characters == NUM_CHAR_IDS - 1:
            raise ValueError(
                "n_characters is 261 (bilm-tf's training value): set it to 262 for a trained model; "
                "the weight file's 261 rows get a zero padding row prepended at load time"
            )
        if self.num_characters != NUM_CHAR_IDS:
            raise ValueError(f"n_characters must be {NUM_CHAR_IDS}, got {self.num_characters!r}")
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh', got {self.activation!r}")
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be None or >= 0, got {value!r}")

    @property
    def num_filters(self):
        return sum(n for _, n in self.filters)

    @classmethod
    def from_options(cls, options):
        """From a bilm-tf options dict (`{"lstm": {...}, "char_cnn": {...}}`)."""
        try:
            lstm, cnn = options["lstm"], options["char_cnn"]
            return cls(
                char_embedding_dim=cnn["embedding"]["dim"],
                filters=cnn["filters"],
                num_highway=cnn.get("n_highway", 0),
                activation=cnn.get("activation", "relu"),
                max_characters_per_token=cnn.get("max_characters_per_token", MAX_CHARS),
                num_characters=cnn.get("n_characters", NUM_CHAR_IDS),
                lstm_dim=lstm["dim"],
                projection_dim=lstm["projection_dim"],
                num_layers=lstm["n_layers"],
                cell_clip=lstm.get("cell_clip"),
                proj_clip=lstm.get("proj_clip"),
                use_skip_connections=bool(lstm.get("use_skip_connections", False)),
            )
        except KeyError as e:
            raise ValueError(
                f"options is missing the key {e.args[0]!r} (bilm-tf options.json layout: "
                f"lstm.dim, lstm.projection_dim, lstm.n_layers, char_cnn.embedding.dim, "
                f"char_cnn.filters)"
            ) from None

    @classmethod
    def from_json(cls, path):
        try:
            with open(path, encoding="utf-8") as f:
                options = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read options file {path!r}: {e}") from None
        if "char_cnn" not in options:
            raise ValueError(
                f"options file {path!r} has no 'char_cnn' section: only character-input biLMs are supported"
            )
        return cls.from_options(options)

    def to_options(self):
        """The bilm-tf/AllenNLP options dict for this architecture."""
        return {
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

    def to_json(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_options(), f, indent=2)


PRESETS = {
    "original": BiLMConfig(),
    "medium": BiLMConfig(num_highway=1, lstm_dim=2048, projection_dim=256),
    "small": BiLMConfig(num_highway=1, lstm_dim=1024, projection_dim=128),
}


def get_config(name):
    """A preset ("small", "medium", "original") by name."""
    if name not in PRESETS:
        raise ValueError(f"unknown config {name!r}: choose one of {sorted(PRESETS)} or pass an options.json")
    return PRESETS[name]
