"""A pretraining run's files: the model directory (`options.json`, `weights.hdf5`, `softmax.hdf5`, `vocab.txt`),
`train_config.json`, and starting a model from an existing biLM (--init-from)."""

import dataclasses
import logging
import os

from elmo_tf.config import BiLMConfig
from elmo_tf.io.atomic import atomic_hdf5, write_json
from elmo_tf.io.bilm_hdf5 import check_weight_file, load_bilm_weights, open_hdf5, save_bilm_weights
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer

log = logging.getLogger(__name__)


def save_softmax(model, path):
    """`softmax/W` `(vocab, P)` and `softmax/b` `(vocab,)` of a `BiLMPretrainer` as hdf5, atomically
    (`elmo_tf.io.atomic`: `path` holds the old file or the whole new one)."""
    with atomic_hdf5(path) as f:
        f.create_dataset("softmax/W", data=model.softmax_kernel.numpy())
        f.create_dataset("softmax/b", data=model.softmax_bias.numpy())


def load_softmax(model, path):
    """Assigns `softmax/W` and `softmax/b` of the hdf5 at `path` to a `BiLMPretrainer`'s softmax, their shapes checked
    first; a file that points outside itself is refused before any data is read (`WeightFileError`)."""
    with open_hdf5(path, what="softmax file") as f:
        for name, var in (("softmax/W", model.softmax_kernel), ("softmax/b", model.softmax_bias)):
            if name not in f:
                raise ValueError(f"softmax file {path!r} has no dataset {name!r}")
            if f[name].shape != tuple(var.shape):
                raise ValueError(f"dataset {name!r} in {path!r} has shape {f[name].shape}, expected {tuple(var.shape)}")
            var.assign(f[name][...])


def write_model_dir(model, vocab, output_dir):
    """`options.json`, `weights.hdf5` (bilm-tf layout), `vocab.txt`, `softmax.hdf5` into `output_dir` (created).

    Each file is written atomically (`elmo_tf.io.atomic`): an error or SIGTERM while writing leaves the previous
    file as it was and no temporary; a temporary left by `kill -9` is removed by the next write.
    """
    os.makedirs(output_dir, exist_ok=True)
    model.config.to_json(os.path.join(output_dir, "options.json"))
    save_bilm_weights(model, os.path.join(output_dir, "weights.hdf5"))
    save_softmax(model, os.path.join(output_dir, "softmax.hdf5"))
    vocab.save(os.path.join(output_dir, "vocab.txt"))


def load_model_dir(model_dir):
    """The `BiLMPretrainer` and `Vocabulary` written by `write_model_dir` (for evaluation)."""
    for name in ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt"):
        if not os.path.isfile(os.path.join(model_dir, name)):
            raise ValueError(f"model dir {model_dir!r} has no {name}")
    vocab = Vocabulary.load(os.path.join(model_dir, "vocab.txt"))
    config = BiLMConfig.from_json(os.path.join(model_dir, "options.json"))
    check_weight_file(config, os.path.join(model_dir, "weights.hdf5"))  # its shapes, before the model is built
    model = BiLMPretrainer(config, len(vocab), dropout=0.0)
    load_bilm_weights(model, os.path.join(model_dir, "weights.hdf5"))
    load_softmax(model, os.path.join(model_dir, "softmax.hdf5"))
    return model, vocab


def load_initial_weights(model, vocab, options_path, weights_path):
    """Starts `model` (a `BiLMPretrainer`) from an existing biLM: the bilm-tf/AllenNLP `weights_path`, and the
    softmax too when a `softmax.hdf5` and a `vocab.txt` with the same words as `vocab` lie beside it (a
    training/pretrain.py output dir); otherwise the softmax keeps its fresh initialization.

    Raises:
        ValueError: `options_path` describes a different architecture than `model.config` (naming the file),
            or a file that does not fit (ConfigError, WeightFileError).
    """
    if BiLMConfig.from_json(options_path) != model.config:
        raise ValueError(
            f"options {options_path!r} describe a different architecture than the run's config; "
            f"pass the same options as the config"
        )
    load_bilm_weights(model, weights_path)
    directory = os.path.dirname(weights_path)
    softmax, vocab_file = os.path.join(directory, "softmax.hdf5"), os.path.join(directory, "vocab.txt")
    if os.path.isfile(softmax) and os.path.isfile(vocab_file) and Vocabulary.load(vocab_file).words == vocab.words:
        load_softmax(model, softmax)
        log.info("initialized biLM and softmax from %s", directory)
    else:
        log.info(
            "initialized the biLM from %s; the softmax starts fresh (no softmax.hdf5 with the same vocabulary "
            "beside it)",
            weights_path,
        )


def write_train_config(trainer, output_dir, total_steps):
    """`train_config.json` (atomically): the `TrainConfig`, the options, total steps, replicas and files."""
    write_json(
        os.path.join(output_dir, "train_config.json"),
        {
            "train": dataclasses.asdict(trainer.config),
            "options": trainer.bilm_config.to_options(),
            "total_steps": total_steps,
            "replicas": trainer.strategy.num_replicas_in_sync,
            "train_files": trainer.train_files,
            "valid_files": trainer.valid_files,
        },
    )
