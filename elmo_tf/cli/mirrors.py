"""Library constants the command lines' parsers need, copied here so that `--help` and usage errors never import
TensorFlow: the modules that define them (`elmo_tf.pretraining`, `elmo_tf.preprocessing.*`, `elmo_tf.io.vocabulary`)
import it when loaded. `tests/cli/test_main.py::test_mirrors_match_the_library` checks each copy against its source.
"""

from elmo_tf.bounds import INT32_MAX, INT64_MAX, SEED_MAX, Bounds

# elmo_tf.preprocessing.lm_dataset
MAX_BUFFER = 2**24
BUFFER_NOTE = "tf.data reserves memory for every slot up front"
BATCH_SIZE = Bounds(int, 1, MAX_BUFFER, high_note=BUFFER_NOTE)
SHUFFLE_BUFFER = Bounds(int, 0, MAX_BUFFER, high_note=BUFFER_NOTE)
TOKENS = Bounds(int, 1, INT32_MAX)

# elmo_tf.preprocessing.tokenizer.TOKENIZERS
TOKENIZERS = ("whitespace", "unicode_script")

# elmo_tf.io.vocabulary.SPECIALS (<S>, </S>, <UNK>)
SPECIALS = ("<S>", "</S>", "<UNK>")

# elmo_tf.pretraining.TrainConfig: field -> (flag, Bounds) of the fields training/pretrain.py takes as flags
_EVERY = Bounds(int, 1, INT64_MAX)
TRAIN_CONFIG_FLAGS = {
    "batch_size": ("--batch-size", BATCH_SIZE),
    "max_tokens": ("--max-tokens", TOKENS),
    "learning_rate": ("--learning-rate", Bounds(float, 0, open_low=True)),
    "clip_norm": ("--clip-norm", Bounds(float, 0)),
    "dropout": ("--dropout", Bounds(float, 0, 1, open_high=True)),
    "num_sampled": ("--num-sampled", Bounds(int, 1, INT32_MAX)),
    "checkpoint_every": ("--checkpoint-every", _EVERY),
    "log_every": ("--log-every", _EVERY),
    "validate_every": ("--validate-every", Bounds(int, 0, INT64_MAX)),
    "shuffle_buffer": ("--shuffle-buffer", SHUFFLE_BUFFER),
    "bucket_width": ("--bucket-width", TOKENS),
    "seed": ("--seed", Bounds(int, 0, SEED_MAX)),
}
