"""Penn Treebank language modelling with the elmo_tf biLM: train a ~5M-parameter model for a CPU budget,
then full-softmax perplexity (forward, backward, average) on valid and test, next to published anchors.

Data: ../shared/data/ptb/ptb.{train,valid,test}.txt (Mikolov's preprocessed PTB: a 10k vocabulary with
<unk> and <eos>, numbers as N; read in place, never copied). Vocabulary: every training word type (9,999;
the "10k" counts <eos>, which is our </S>) plus <S>, </S>, <UNK>: 10,002 entries, built with
`elmo_tf.io.build_vocabulary`; valid and test hold no other words.

Model (`PTB_5M`, parameters counted by Keras, softmax included): Kim et al.'s small char CNN (char
embedding 15, filters 25 x width for widths 1-6 = 525, one highway layer), 2-layer LSTM 384 units with
192-dim projection in each direction, one softmax (10,002 x 192 + bias) shared by both directions:
5,282,610 parameters, of which 1.93M softmax, 0.69M char CNN, 2.66M LSTMs (1.33M per direction).

Training: `elmo_tf.pretraining.Trainer` in this process, run by `elmo_tf.pretraining.run_pretraining` (the same
loop, checkpoints, log.csv and model directory as training/pretrain.py), default MirroredStrategy
(--cpu-replicas N splits the CPU), sampled softmax with --num-sampled log-uniform negatives, Adagrad 0.2 /
clip 10 / dropout 0.1 (the original recipe) unless flags say otherwise, sentences of up to --max-tokens (100:
every PTB sentence whole). It stops after --steps, or when --minutes of training wall time are spent
(`elmo_tf.pretraining.StopAfterMinutes`, checked after every step; the first step's tracing is counted, start-up
and evaluation are not). The run directory keeps checkpoints; --resume continues it, and the budget counts
the run's total training time (restored from the checkpoint), not only this session's.

Evaluation: `elmo_tf.pretraining.evaluate_perplexity`, full softmax over the 10,002 entries. Each sentence is
scored on its own from <S> (no state carried across sentences), targets = words + </S> (forward) or
words + <S> (backward): 73,760 targets on valid and 82,430 on test, the same counts as the usual
stream evaluation (words + <eos>). Carrying no context across sentence boundaries makes our numbers
slightly pessimistic against the anchors, which evaluate the test set as one stream.

Anchors (test perplexity, forward LMs, as published):
  Kim et al. 2016, "Character-Aware Neural Language Models", LSTM-Char-Small: 92.3 (5M parameters;
    25 epochs of SGD, batch 20, BPTT 35, dropout 0.5)
  Zaremba et al. 2014, "Recurrent Neural Network Regularization", medium LSTM: valid 86.2, test 82.7
    (20M parameters, 39 epochs)
The JSON and the table also give the epochs trained and the time 25 epochs would take at the measured speed.

usage: .venv/bin/python bench/pretrain_ptb.py --minutes 60                # the real run: alone on the machine
       .venv/bin/python bench/pretrain_ptb.py --steps 20 --eval-lines 200 # smoke run (a minute)
Writes bench/results/pretrain_ptb.json (--out) and the model under bench/results/pretrain_ptb_run/ (--run-dir).
"""

import argparse
import csv
import logging
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import PTB_5M, git_commit, head_lines, result_fields, write_result  # bench/common.py, beside this script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "ptb"))
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "pretrain_ptb.json")
DEFAULT_RUN_DIR = os.path.join(REPO, "bench", "results", "pretrain_ptb_run")
log = logging.getLogger("pretrain_ptb")

ANCHORS = [
    {"model": "Kim et al. 2016 LSTM-Char-Small (forward)", "params": 5.0e6, "valid": None, "test": 92.3, "epochs": 25},
    {"model": "Zaremba et al. 2014 medium LSTM (forward)", "params": 20e6, "valid": 86.2, "test": 82.7, "epochs": 39},
]
DEFAULT_LR = {"adagrad": 0.2, "adam": 1e-3, "sgd": 1.0}


def make_clock(log_every):
    """A Keras callback timing the steps after the first (which includes tracing), logging every `log_every`."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.start = self.last = self.first_step = None

        def on_train_batch_end(self, step, logs=None):  # `Trainer.fit` passes the step number as `batch`
            now = time.perf_counter()
            if self.start is None:
                self.start, self.first_step = now, step
            self.last = now
            if step % log_every == 0:
                log.info("step %d loss %.3f (%.0f s)", step, logs["loss"], now - self.start)

    return Clock()


def head_file(path, n_lines, tmp_dir):
    """`path` itself, or a temporary copy of its first `n_lines` lines (smoke runs)."""
    if not n_lines:
        return path
    return head_lines(path, n_lines, os.path.join(tmp_dir, f"head{n_lines}-{os.path.basename(path)}"))


def session_rows(run_dir, first_step):
    """log.csv rows of this session (steps after `first_step`)."""
    path = os.path.join(run_dir, "log.csv")
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if int(r["step"]) > first_step]


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA, help="folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=60.0, help="wall-clock training budget (60)")
    budget.add_argument("--steps", type=int, default=0, help="train exactly this many steps instead")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per step, all replicas (64)")
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--bucket-width", type=int, default=10, help="length buckets this many tokens wide (10)")
    p.add_argument(
        "--matmul-precision",
        default="float32",
        choices=("float32", "bfloat16"),
        help="dtype of the training step's LSTM and softmax matmuls (float32; evaluation is float32 either way)",
    )
    p.add_argument("--num-sampled", type=int, default=2048, help="sampled-softmax negatives (2048 of 10,002)")
    p.add_argument("--optimizer", default="adagrad", choices=sorted(DEFAULT_LR))
    p.add_argument("--learning-rate", type=float, default=None, help="default 0.2 adagrad, 1e-3 adam, 1.0 sgd")
    p.add_argument("--clip-norm", type=float, default=10.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--cpu-replicas", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TensorFlow's default)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--eval-lines", type=int, default=0, help="evaluate on the first N lines only (smoke runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, help="checkpoints, logs and the final model")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir (default: start fresh)")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON results")
    return p


def make_trainer(args, files):
    """The Trainer of the PTB model on `files["train"]` with its Checkpoints in --run-dir (a fresh run unless
    --resume): `(trainer, checkpoints, vocab)`. CheckpointMismatchError when --resume meets other settings."""
    import tensorflow as tf

    from elmo_tf.config import BiLMConfig
    from elmo_tf.io.vocabulary import build_vocabulary, count_words
    from elmo_tf.pretraining import Checkpoints, TrainConfig, Trainer
    from elmo_tf.pretraining.distribute import get_strategy, set_cpu_replicas

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    set_cpu_replicas(args.cpu_replicas)  # before any op
    import keras

    keras.utils.set_random_seed(args.seed)
    vocab = build_vocabulary(count_words([files["train"]]))
    log.info("vocabulary: %d entries (%d word types + 3 specials)", len(vocab), len(vocab) - 3)
    if not args.resume and os.path.isdir(args.run_dir):
        shutil.rmtree(args.run_dir)
    train_config = TrainConfig(
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        steps=args.steps or 10**9,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate or DEFAULT_LR[args.optimizer],
        clip_norm=args.clip_norm,
        dropout=args.dropout,
        num_sampled=args.num_sampled,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        shuffle_buffer=50000,
        bucket_width=args.bucket_width,
        matmul_precision=args.matmul_precision,
        seed=args.seed,
    )
    trainer = Trainer(get_strategy("mirrored"), BiLMConfig(**PTB_5M), train_config, vocab, [files["train"]])
    checkpoints = Checkpoints(trainer, args.run_dir)
    checkpoints.restore()
    return trainer, checkpoints, vocab


def param_counts(model):
    """The biLM's parameters in all and by part (softmax, char CNN, LSTMs)."""
    return {
        "total": model.count_params(),
        "softmax": int(model.softmax_kernel.shape[0] * (model.softmax_kernel.shape[1] + 1)),
        "char_cnn": model.char_cnn.count_params(),
        "bilm_lstms": model.bilm.count_params(),
    }


SENTENCES_PER_EPOCH = 42068  # ptb.train.txt lines; none is cut at --max-tokens 100
TARGETS_PER_EPOCH = 887521 + SENTENCES_PER_EPOCH


def train(args, trainer, checkpoints):
    """Trains for --steps or --minutes from where the run stands; what the session did: first and last step, what
    stopped it, wall and CPU seconds, targets/s after the first (tracing) step and the log's median, the last
    sampled-softmax loss, epochs in all, hours for 25 epochs at this speed."""
    from elmo_tf.pretraining import run_pretraining

    first_step = int(trainer.step.numpy())
    params = param_counts(trainer.model)
    log.info(
        "%s parameters (softmax %s, char CNN %s, LSTMs %s); %d replicas; from step %d; budget %s",
        *(f"{params[k]:,}" for k in ("total", "softmax", "char_cnn", "bilm_lstms")),
        trainer.strategy.num_replicas_in_sync,
        first_step,
        f"{args.steps} steps" if args.steps else f"{args.minutes:g} min",
    )
    clock = make_clock(args.log_every)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run = run_pretraining(
        trainer,
        checkpoints,
        trainer.config.steps,
        callbacks=[clock],
        max_minutes=None if args.steps else args.minutes,
        progress=False,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    last_step = int(trainer.step.numpy())
    rows = session_rows(args.run_dir, first_step)
    speeds = [float(r["tokens_per_s"]) for r in rows[1:]]  # the first window includes tracing
    # speed after the first (tracing) step: sentences/s x the corpus's mean targets per sentence
    timed_steps = last_step - (last_step if clock.first_step is None else clock.first_step)
    timed_s = clock.last - clock.start if clock.start is not None else 0.0
    tokens_per_s = (
        timed_steps * args.batch_size * TARGETS_PER_EPOCH / SENTENCES_PER_EPOCH / timed_s
        if timed_steps > 0 and timed_s > 0
        else None
    )
    session = {
        "params": params,
        "stopped_by": "budget" if run["stop_reason"] == "stop_training" else "steps",
        "steps": {"first": first_step, "last": last_step},
        "epochs": last_step * args.batch_size / SENTENCES_PER_EPOCH,
        "train_seconds": {"wall": wall, "cpu": cpu},
        "targets_per_s": tokens_per_s,
        "targets_per_s_log_median": sorted(speeds)[len(speeds) // 2] if speeds else None,
        "train_loss_sampled": float(rows[-1]["loss"]) if rows else None,
        "hours_for_25_epochs": 25 * TARGETS_PER_EPOCH / tokens_per_s / 3600 if tokens_per_s else None,
    }
    log.info(
        "trained %d steps (%s) in %.0f s wall, %.0f s CPU; %s targets/s; %.3f epochs in all",
        last_step - first_step,
        session["stopped_by"],
        wall,
        cpu,
        fmt(tokens_per_s, ".0f"),
        session["epochs"],
    )
    return session


def evaluate(args, model, vocab, files):
    """Full-softmax perplexity of `model` on the valid and test splits (their first --eval-lines lines, when given)."""
    from elmo_tf.pretraining import evaluate_perplexity

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for split in ("valid", "test"):
            path = head_file(files[split], args.eval_lines, tmp)
            t0 = time.perf_counter()
            results[split] = evaluate_perplexity(
                model, vocab, [path], batch_size=args.eval_batch_size, max_tokens=args.max_tokens
            )
            results[split]["seconds"] = time.perf_counter() - t0
            results[split]["lines"] = args.eval_lines or None
            log.info(
                "%s: forward %.2f backward %.2f average %.2f (%d targets, %.0f s)",
                split,
                *(results[split][k] for k in ("forward", "backward", "average", "tokens", "seconds")),
            )
    return results


def print_report(args, session, results):
    """The perplexity table beside the anchors, and a line on the training session."""
    steps, params, seconds = session["steps"], session["params"], session["train_seconds"]
    wall, cpu = seconds["wall"], seconds["cpu"]
    name = f"elmo_tf biLM, {steps['last']} steps ({session['epochs']:.2f} epochs)"
    print()
    print(
        "Penn Treebank, full-softmax perplexity" + (f" (first {args.eval_lines} lines only)" if args.eval_lines else "")
    )
    print("| model | params | valid fwd | valid bwd | valid avg | test fwd | test bwd | test avg |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    v, t = results["valid"], results["test"]
    print(
        f"| {name} | {params['total'] / 1e6:.2f}M | {v['forward']:.1f} | {v['backward']:.1f} | {v['average']:.1f} "
        f"| {t['forward']:.1f} | {t['backward']:.1f} | {t['average']:.1f} |"
    )
    for a in ANCHORS:
        print(
            f"| {a['model']}, {a['epochs']} epochs | {a['params'] / 1e6:.0f}M | {fmt(a['valid'])} | - | - "
            f"| {fmt(a['test'])} | - | - |"
        )
    print(
        f"\ntraining: {steps['last'] - steps['first']} steps this session in {wall / 60:.1f} min wall ({cpu / 60:.1f} "
        f"min CPU, the first step's tracing included), {fmt(session['targets_per_s'], '.0f')} targets/s after it, last "
        f"train loss (sampled softmax) {fmt(session['train_loss_sampled'], '.3f')}; 25 epochs at this speed: "
        f"{fmt(session['hours_for_25_epochs'], '.1f')} h"
    )


TRAIN_CONFIG_FIELDS = (
    *("batch_size", "max_tokens", "optimizer", "learning_rate", "clip_norm", "dropout", "num_sampled"),
    *("shuffle_buffer", "bucket_width", "matmul_precision", "seed"),
)


def main(argv=None):
    args = build_parser().parse_args(argv)
    commit = git_commit(REPO)  # the code that trains (read before the run: the checkout may change during it)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    files = {split: os.path.join(args.data, f"ptb.{split}.txt") for split in ("train", "valid", "test")}
    missing = [f for f in files.values() if not os.path.isfile(f)]
    if missing:
        log.error("PTB files not found: %s", missing)
        return 2
    from elmo_tf.pretraining import CheckpointMismatchError

    try:
        trainer, checkpoints, vocab = make_trainer(args, files)
    except CheckpointMismatchError as e:  # --resume with other settings than the run's
        log.error("--resume: %s", e)
        return 2
    session = train(args, trainer, checkpoints)
    results = evaluate(args, trainer.model, vocab, files)
    print_report(args, session, results)
    import keras
    import tensorflow as tf

    record = {
        "benchmark": "pretrain_ptb",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **result_fields(commit=commit),
        "machine": {"load_average": os.getloadavg(), "tensorflow": tf.__version__, "keras": keras.__version__},
        "options": trainer.model.config.to_options(),
        "vocab_size": len(vocab),
        "train_config": {k: getattr(trainer.config, k) for k in TRAIN_CONFIG_FIELDS},
        "replicas": trainer.strategy.num_replicas_in_sync,
        "budget_minutes": None if args.steps else args.minutes,
        **session,
        "valid": results["valid"],
        "test": results["test"],
        "anchors": ANCHORS,
        "run_dir": args.run_dir,
        "eval_note": "each sentence scored from <S> with zero state; anchors evaluate the test set as one stream",
    }
    write_result(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
