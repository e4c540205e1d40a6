"""The type and range of a number, shared by config fields and their command-line flags, and the config fields that
carry them (`config_field`, `check_bounds`, `field_flag`, `ConfigError`). No TensorFlow or NumPy here: the command
lines check their flags with it before TensorFlow loads."""

import dataclasses
import math
import numbers

from elmo_tf.errors import ElmoTFError

__all__ = [
    *("BATCH_SIZE", "INT32_MAX", "INT64_MAX", "MAX_BUFFER", "SEED_MAX", "SHUFFLE_BUFFER", "TOKENS", "Bounds"),
    *("ConfigError", "check_bounds", "config_field", "field_flag"),
]


def _show(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# The ceilings of number fields and flags: a size that becomes a tensor dimension or a TensorFlow int32 stays within
# int32, a count TensorFlow holds as an int64 (steps) within int64, a seed within numpy's range (np.random.seed and
# keras.utils.set_random_seed refuse the rest).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SEED_MAX = 2**32 - 1
_CEILING_NOTES = {INT32_MAX: "int32", INT64_MAX: "int64", SEED_MAX: "numpy's seeds are 0 <= seed < 2**32"}


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The type and range of a number: an int, or a finite float, in [`low`, `high`] (`open_low` / `open_high`
    leave an end out; None: no bound). One object serves a config field and its command-line flag.

    Args:
        kind: int or float.
        high_note: why the upper bound is what it is, shown when a value is over it (int32, int64 and numpy's seed
            ceiling explain themselves).
    Example:
        Bounds(int, 0, SEED_MAX).problem(-1)  # "must be >= 0, got -1"
    """

    kind: type = int
    low: float = None
    high: float = None
    open_low: bool = False
    open_high: bool = False
    high_note: str = ""

    def requirement(self, value):
        """What `value` (already an int or float) breaks, e.g. "must be >= 1", or None when it fits."""
        if self.kind is float and not math.isfinite(value):
            return "must be a finite number"
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return f"must be {'>' if self.open_low else '>='} {self.low}"
        if self.high is not None and (value >= self.high if self.open_high else value > self.high):
            note = self.high_note or _CEILING_NOTES.get(self.high, "")
            return f"must be {'<' if self.open_high else '<='} {self.high}" + (f" ({note})" if note else "")
        return None

    def problem(self, value):
        """What is wrong with `value` ("must be >= 1, got 0"), or None. Bools and strings are refused, an int is a
        valid float."""
        if not (_is_int(value) if self.kind is int else _is_number(value)):
            return f"must be {'an int' if self.kind is int else 'a number'}, got {_show(value)}"
        broken = self.requirement(value)
        return f"{broken}, got {_show(value)}" if broken else None


# The language-model data (`elmo_tf.preprocessing.lm_dataset`, `TrainConfig`, the pretrain and evaluate-lm flags).
# tf.data gives every slot of a shuffle buffer and of a batch window memory up front (about 24 bytes each, before any
# element arrives): a buffer of 2**27 took 3 GB and 30 s here, one of 2**31 aborts the process (std::bad_alloc)
MAX_BUFFER = 2**24
BUFFER_NOTE = "tf.data reserves memory for every slot up front"
BATCH_SIZE = Bounds(int, 1, MAX_BUFFER, high_note=BUFFER_NOTE)
SHUFFLE_BUFFER = Bounds(int, 0, MAX_BUFFER, high_note=BUFFER_NOTE)
TOKENS = Bounds(int, 1, INT32_MAX)  # max_tokens and bucket_width: token counts, int32 in the graph


class ConfigError(ElmoTFError):
    """An invalid config field (of a `BiLMConfig`, a `TrainConfig`, ...): `source: key problem`, e.g.
    `options.json: lstm.dim must be a positive int, got '4096'`.

    Attributes:
        problem: what is wrong, with the value received.
        key: the field (`lstm_dim`) or options.json key path (`lstm.dim`) at fault, or None for the whole file.
        source: the options file (or None).
    """

    def __init__(self, problem, key=None, source=None):
        text = f"{key} {problem}" if key else problem
        super().__init__(f"{source}: {text}" if source else text, key=key, path=source)
        self.problem, self.source = problem, source


def config_field(default, flag=None, bounds=None):
    """A dataclass field that knows the command-line flag setting it and, for a number, its `Bounds`: the command
    lines build their argparse types from it (`elmo_tf.cli.field_type`) and name the flag of a `ConfigError`."""
    return dataclasses.field(default=default, metadata={"flag": flag, "bounds": bounds})


def check_bounds(config):
    """Raises `ConfigError` (key: the field) for the first field of the dataclass `config` outside its `Bounds`."""
    for field in dataclasses.fields(config):
        bounds = field.metadata.get("bounds")
        problem = bounds and bounds.problem(getattr(config, field.name))
        if problem:
            raise ConfigError(problem, field.name)


def field_flag(config_class, name):
    """The command-line flag of the field `name` of `config_class` (a `config_field`), or None."""
    for field in dataclasses.fields(config_class):
        if field.name == name:
            return field.metadata.get("flag")
    return None
