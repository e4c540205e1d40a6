"""How a biLM is trained (`TrainConfig`), the names the pretraining modules share, and their errors.

No TensorFlow or NumPy here: the pretrain command line builds its flags from `TrainConfig`'s fields at once.
"""

import dataclasses

from elmo_tf.bounds import (
    BATCH_SIZE,
    INT32_MAX,
    INT64_MAX,
    SEED_MAX,
    SHUFFLE_BUFFER,
    TOKENS,
    Bounds,
    ConfigError,
    check_bounds,
    config_field,
)
from elmo_tf.errors import ElmoTFError

OPTIMIZERS = ("adagrad", "adam", "sgd")
# the TrainConfig fields that set which batches a step sees: a resumed run skips the steps already trained, which
# lands on the same data position only when they are the run's own (`Checkpoints.restore` checks them)
DATA_ORDER_FIELDS = ("batch_size", "max_tokens", "shuffle_buffer", "bucket_width", "seed")
# How `Trainer.fit` (`elmo_tf.pretraining.loop`) ended, as `logs["stop_reason"]` of `on_train_end`.
STOP_REASONS = ("steps", "stop_training", "interrupted", "non_finite", "error")


class NonFiniteLossError(ElmoTFError, RuntimeError):
    """The loss became NaN or inf; nothing is saved, so the last good checkpoint is kept."""


class CheckpointMismatchError(ElmoTFError):
    """A checkpoint that cannot be resumed: it does not fit the model or optimizer, or the workers of a
    multi-worker run restored different steps."""


# the types and ranges of TrainConfig's number fields (the same objects check training/pretrain.py's flags)
_SIZE = Bounds(int, 1, INT32_MAX)
_EVERY = Bounds(int, 1, INT64_MAX)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train (the architecture is a `BiLMConfig`). Defaults follow the original recipe where it
    fits a CPU: Adagrad lr 0.2 (initial accumulator 1.0), global-norm clip 10, dropout 0.1.

    Each field knows its training/pretrain.py flag and its range (`elmo_tf.bounds.config_field`): a bad value raises
    `ConfigError` whose `key` is the field, and `field_flag(TrainConfig, e.key)` is the flag to blame.
    """

    batch_size: int = config_field(128, "--batch-size", BATCH_SIZE)  # sentences per step, all replicas together
    max_tokens: int = config_field(50, "--max-tokens", TOKENS)  # longer lines are cut into pieces of this many tokens
    steps: int = config_field(0, "--steps", Bounds(int, 0, INT64_MAX))  # total steps (0: from epochs)
    epochs: float = config_field(0.0, "--epochs", Bounds(float, 0))
    optimizer: str = config_field("adagrad", "--optimizer")
    learning_rate: float = config_field(0.2, "--learning-rate", Bounds(float, 0, open_low=True))
    clip_norm: float = config_field(10.0, "--clip-norm", Bounds(float, 0))  # global-norm clipping (0: off)
    dropout: float = config_field(0.1, "--dropout", Bounds(float, 0, 1, open_high=True))
    num_sampled: int = config_field(8192, "--num-sampled", _SIZE)
    checkpoint_every: int = config_field(200, "--checkpoint-every", _EVERY)
    log_every: int = config_field(10, "--log-every", _EVERY)
    validate_every: int = config_field(0, "--validate-every", Bounds(int, 0, INT64_MAX))  # 0: only at the end
    shuffle_buffer: int = config_field(10000, "--shuffle-buffer", SHUFFLE_BUFFER)  # 0: no shuffling
    # sentences batched in length buckets this wide (see lm_dataset for the measured trade-off)
    bucket_width: int = config_field(10, "--bucket-width", TOKENS)
    # dtype of the training step's LSTM and sampled-softmax matmuls; "bfloat16" steps faster on CPUs with
    # AVX512_BF16 and on GPUs, with the weights, state and optimizer still float32 (bench/README.md has the
    # measurements); evaluation and exports are float32 either way. The command line's --precision (auto: bfloat16
    # where the CPU multiplies it natively, `elmo_tf.precision.resolve_precision`) or its older --matmul-precision.
    matmul_precision: str = config_field("float32", "--precision")
    seed: int = config_field(0, "--seed", Bounds(int, 0, SEED_MAX))  # data order (and the CLI's weights)

    def __post_init__(self):
        check_bounds(self)
        if self.steps == 0 and self.epochs == 0:
            raise ConfigError(f"or epochs must be > 0, got steps={self.steps}, epochs={self.epochs}", "steps")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"must be one of {OPTIMIZERS}, got {self.optimizer!r}", "optimizer")
        precisions = matmul_precisions()
        if self.matmul_precision not in precisions:
            raise ConfigError(f"must be one of {precisions}, got {self.matmul_precision!r}", "matmul_precision")


def matmul_precisions():
    """The values of `TrainConfig.matmul_precision`: the dtypes BiLM's training scan takes (float32, bfloat16)."""
    from elmo_tf.layers.lstm_constants import MATMUL_DTYPES  # deferred: elmo_tf.layers imports Keras

    return tuple(d for d in MATMUL_DTYPES if d)
