"""The biLM Trainer the training benchmarks drive (bench/train_throughput.py's workers, bench/trace_step.py): built as
training/pretrain.py builds it (MirroredStrategy over 1 or 2 logical CPUs, Adagrad, clip 10, dropout 0.1) on the
first lines of PTB train, with its compiled step and its own tf.data input, without checkpoints or logs; the settings
it is measured at, and the matmul FLOP of one target. Works with this checkout's `elmo_tf` and with an earlier
commit's (a baseline extracted with `git archive`), told apart once, by the Trainer's signature."""

import inspect
import os

from common import PTB_5M, REPO, head_lines, model_flops

DEFAULT_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "ptb", "ptb.train.txt"))
SETTINGS = {  # the measured settings: sampled negatives, sentence length cap, timed steps (full run, --quick)
    "ptb5m": {"num_sampled": 2048, "max_tokens": 100, "steps": 30, "quick_steps": 3},
    "small": {"num_sampled": 8192, "max_tokens": 50, "steps": 12, "quick_steps": 2},
    "original": {"num_sampled": 8192, "max_tokens": 50, "steps": 10, "quick_steps": 2},
}


def bilm_config(name):
    """The BiLMConfig of setting `name`: the 5.28M PTB model of bench/pretrain_ptb.py, or a preset."""
    from elmo_tf.config import BiLMConfig, get_config

    return BiLMConfig(**PTB_5M) if name == "ptb5m" else get_config(name)


def flops_per_target(options, num_sampled):
    """Forward matmul FLOP per target: the char CNN, every LSTM layer, the sampled softmax."""
    part = model_flops(options, num_sampled)
    return part["char_cnn"] + part["layers"] * part["lstm"] + part["softmax"]


def make_trainer(tmp, config, *, data=DEFAULT_DATA, lines=5000, replicas=1, batch_size=64, threads=0, **train):
    """The Trainer of this process's `elmo_tf` (ours or a baseline's) for setting `config` on the first `lines`
    lines of `data` (copied into `tmp`), with its compiled step and distributed dataset: `(trainer, train_step,
    dataset, vocab, corpus)`. `train`: `max_tokens` and `num_sampled` (the setting's unless given), and the
    TrainConfig fields a baseline may lack, `bucket_width` (0: TrainConfig's default) and `matmul_precision`."""
    import tensorflow as tf

    from elmo_tf.io.vocabulary import build_vocabulary, count_words

    try:
        from elmo_tf.pretraining import TrainConfig, Trainer
        from elmo_tf.pretraining.distribute import get_strategy, set_cpu_replicas
    except ModuleNotFoundError as e:  # a baseline's tree (97bf9b2): elmo_tf/pretrain.py and elmo_tf/distribute.py
        if e.name != "elmo_tf.pretraining":
            raise
        from elmo_tf.distribute import get_strategy, set_cpu_replicas
        from elmo_tf.pretrain import TrainConfig, Trainer

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    set_cpu_replicas(replicas)
    import keras

    keras.utils.set_random_seed(0)
    vocab = build_vocabulary(count_words([data]))
    corpus = head_lines(data, lines, os.path.join(tmp, "train.txt"))
    pipeline = {}
    if train.get("bucket_width") and "bucket_width" in TrainConfig.__dataclass_fields__:  # not in a baseline's
        pipeline["bucket_width"] = train["bucket_width"]
    if train.get("matmul_precision", "float32") != "float32":  # only ours has it; the driver passes it to ours only
        pipeline["matmul_precision"] = train["matmul_precision"]
    train_config = TrainConfig(
        **pipeline,
        batch_size=batch_size,
        max_tokens=train.get("max_tokens") or SETTINGS[config]["max_tokens"],
        steps=10**6,
        num_sampled=train.get("num_sampled") or SETTINGS[config]["num_sampled"],
        shuffle_buffer=lines,
    )
    strategy = get_strategy("mirrored")
    if "output_dir" in inspect.signature(Trainer).parameters:  # a baseline's Trainer, which did I/O itself
        trainer = Trainer(strategy, bilm_config(config), train_config, vocab, [corpus], os.path.join(tmp, "run"))
        train_step, dataset = trainer._train_step, trainer._dataset(0)
    else:
        trainer = Trainer(strategy, bilm_config(config), train_config, vocab, [corpus])
        train_step, dataset = trainer.train_step, trainer.distributed_dataset(0)
    return trainer, train_step, dataset, vocab, corpus
