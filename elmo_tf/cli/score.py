"""`elmo-tf score`: per-token log-probabilities (and top-k words) of every line of a file under a biLM with its
softmax, as JSON lines (`elmo_tf.embed.score`).

Errors follow `elmo_tf.cli`: a bad flag, a missing file or an output that cannot be written exits 2 before anything is
loaded; a bad options.json, weight, softmax or vocabulary file, or a bad input line exits 1; each with one line naming
the flag and the file.
"""

import argparse
import logging
import os
import time

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    bounded_number,
    check_output_file,
    check_text_start,
    existing_file,
    setup_logging,
    size_int,
    threads_int,
)
from elmo_tf.cli.models import resolve_model
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision
from elmo_tf.cli.progress import Progress, add_resume_flags, journaled_run
from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS

PROG = "elmo-tf score"
MAX_TOP_K = 1000  # words per position and direction: a JSON line holds 2 x (n + 1) x k pairs
MODEL_FILES = {"options": "options.json", "weights": "weights.hdf5", "softmax": "softmax.hdf5", "vocab": "vocab.txt"}

EXAMPLES = """examples:
  elmo-tf score --model runs/small --input sentences.txt --output scores.jsonl
  elmo-tf score --options elmo_2x4096_512_2048cnn_2xhighway_options.json \\
      --weights elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5 \\
      --softmax elmo_2x4096_512_2048cnn_2xhighway_softmax_weights.hdf5 --vocab vocab-2016-09-10.txt \\
      --input sentences.txt --output scores.jsonl --top-k 5
  elmo-tf score --model runs/small --input big.txt --output scores.jsonl --resume   # after a crash
  elmo-tf score --model runs/small --input s.txt --output scores.jsonl --precision bfloat16

input: one whitespace-tokenized sentence per line (as embed reads it). output: one JSON line per input line:
  {"tokens": [w_1 .. w_n],
   "forward_log_probs":  [log p(w_1|<S>), ..., log p(w_n|<S> w_1..w_n-1), log p(</S>|<S> w_1..w_n)],
   "backward_log_probs": [log p(w_1|w_2..w_n </S>), ..., log p(w_n|</S>), log p(<S>|w_1..w_n </S>)],
   "forward_top_k": [[[word, log_prob], ... k] per position], "backward_top_k": ...}   (with --top-k)
natural logs; entry i - 1 is about word i in both directions, entry n about the sentence boundary. A record scored
in bfloat16 (--precision) says so: "precision": "bfloat16". Words not in the
vocabulary are scored as <UNK>. A line of more than --max-sentence-tokens tokens is scored on its first
that many, and its record says so: "truncated": true, "line_tokens": its own count (a piece scored apart would
start as a sentence does). A sentence's perplexity is exp(-mean(forward_log_probs)) (as evaluate-lm counts it).
The full softmax is computed a slice of the vocabulary at a time, so an 800k-word softmax needs no (positions x
800k) array.
resume: the lines are written as they are scored, in shards of about --shard-tokens tokens, to a hidden directory
beside the output (.<output name>.partial/); the output is their concatenation, written under a hidden temporary
name and renamed at the end, and the directory removed. An interrupted run (kill -9, SIGTERM: exit 143, Ctrl-C:
exit 130, a full disk: exit 1) leaves an existing output as it was and keeps its finished shards: the same command
with --resume scores only the rest and writes the same bytes as an uninterrupted run. It is refused (exit 2,
naming each difference) when the input's content, the model, --precision, the softmax, the vocabulary, --top-k or
an option that changes the output differs; without --resume a run starts over.
progress: on a terminal a bar with the total, the rate and the time left; otherwise a log line every
--log-interval seconds; nothing with --quiet.
"""


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description="Score every line of a file with a biLM language model: per-token log-probabilities in both "
        "directions, and optionally the k most likely words, as JSON lines.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        metavar="DIR|NAME|URL",
        help=f"a pretraining run dir ({', '.join(MODEL_FILES.values())}), instead of the four files; or a released "
        "model's name or URL (`elmo-tf models`: its softmax and vocabulary where published, else give --softmax and "
        "--vocab), downloaded once into the cache",
    )
    p.add_argument("--options", type=existing_file("--options"), help="bilm-tf/AllenNLP options.json")
    p.add_argument("--weights", type=existing_file("--weights"), help="bilm-tf/AllenNLP weights.hdf5")
    p.add_argument("--softmax", type=existing_file("--softmax"), help="softmax hdf5 (softmax/W [V, P], softmax/b [V])")
    p.add_argument("--vocab", type=existing_file("--vocab"), help="the softmax's vocabulary, one word per line")
    p.add_argument("--input", required=True, type=existing_file("--input"), help="text file, one sentence per line")
    p.add_argument("--output", required=True, help="JSON lines file to write (replaced whole at the end)")
    p.add_argument(
        "--top-k",
        type=bounded_number("--top-k", int, 0, MAX_TOP_K),
        default=0,
        help=f"also write the k most likely words per position and direction (0: none; at most {MAX_TOP_K})",
    )
    p.add_argument("--batch-size", type=size_int("--batch-size"), default=32, help="sentences per batch (32)")
    p.add_argument(
        "--max-batch-tokens",
        type=size_int("--max-batch-tokens"),
        default=None,
        help="cap on sentences x the longest sentence per batch (default 128 x batch size, fewer for a big model and "
        "vocabulary: about 4 s of work, the time SIGTERM may wait); a longer sentence goes alone",
    )
    p.add_argument(
        "--max-sentence-tokens",
        type=size_int("--max-sentence-tokens"),
        default=DEFAULT_MAX_SENTENCE_TOKENS,
        help='score a longer line on its first this many tokens, its record marked "truncated" '
        f"({DEFAULT_MAX_SENTENCE_TOKENS})",
    )
    p.add_argument(
        "--threads",
        type=threads_int("--threads"),
        default=0,
        help="TensorFlow intra- and inter-op threads (0: TensorFlow's default)",
    )
    add_precision_flag(p, what=": of the biLM and the softmax's matmuls; log-probabilities are float32")
    add_resume_flags(p, 50_000, what="option that changes the output (--top-k, --precision, the batching)")
    return p


def model_files(args):
    """`{flag: path}` of the four model files, from --model or the flags; UsageError naming what is missing."""
    given = {flag: getattr(args, flag) for flag in MODEL_FILES}
    from elmo_tf.presets import is_preset

    if args.model and is_preset(args.model):
        named = [f"--{flag}" for flag in ("options", "weights") if given[flag]]
        if named:
            raise UsageError(f"--model: not allowed with {', '.join(named)}")
        wanted = tuple(role for role in ("softmax", "vocab") if not given[role])
        files = {**given, **resolve_model("--model", args.model, roles=wanted, quiet=args.quiet)}
        for role in ("softmax", "vocab"):
            if not files[role]:
                raise UsageError(f"--model: {args.model!r} publishes no {MODEL_FILES[role]}; give --{role}")
        return files
    if args.model:
        if not os.path.isdir(args.model):
            raise UsageError(f"--model: not a directory, a released model's name or a URL: {args.model!r}")
        named = [f"--{flag}" for flag, path in given.items() if path]
        if named:
            raise UsageError(f"--model: not allowed with {', '.join(named)}")
        files = {flag: os.path.join(args.model, name) for flag, name in MODEL_FILES.items()}
        for name, path in zip(MODEL_FILES.values(), files.values()):
            if not os.path.isfile(path):
                raise UsageError(f"--model: {args.model!r} has no {name} (expected a pretraining run dir)")
        return files
    for flag, path in given.items():
        if not path:
            raise UsageError(f"--{flag}: required (or pass --model RUN_DIR)")
    return given


def load(files, top_k, precision="float32"):
    """The `LanguageModel` of the four files, computing in `precision`; DataError naming the flag and the file."""
    from elmo_tf.config import ConfigError
    from elmo_tf.errors import ElmoTFError
    from elmo_tf.io import WeightFileError
    from elmo_tf.io.softmax import LMVocabularyError
    from elmo_tf.models.language_model import load_language_model

    try:
        return load_language_model(
            files["options"], files["weights"], files["softmax"], files["vocab"], top_k=top_k, precision=precision
        )
    except ConfigError as e:
        raise DataError(f"--options: {e}") from None
    except LMVocabularyError as e:
        raise DataError(f"--vocab: {e}") from None
    except WeightFileError as e:  # its message starts with its file: the weights or the softmax
        flag = "--softmax" if str(e).startswith(str(files["softmax"])) else "--weights"
        raise DataError(f"{flag}: {e}") from None
    except ElmoTFError as e:
        if e.key == "top_k":  # more words than the vocabulary holds
            raise UsageError(f"--top-k: {e}") from None
        raise


# the flag that sets each entry of score_file's fingerprint (named when a resume is refused)
FINGERPRINT_FLAGS = {
    "input": "--input",
    "model": "--options/--weights",
    "precision": "--precision",
    "softmax": "--softmax",
    "vocab": "--vocab",
    "top_k": "--top-k",
    "batch_size": "--batch-size",
    "max_batch_tokens": "--max-batch-tokens",
    "max_sentence_tokens": "--max-sentence-tokens",
    "long_sentences": "elmo-tf's version (long lines were handled otherwise)",
    "shard_tokens": "--shard-tokens",
    "threads": "--threads",
    "tensorflow": "TensorFlow version",
}


def main(argv=None, prog=PROG):
    """`score`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_parser(prog).parse_args(argv)
    files = model_files(args)
    inputs = [("--input", args.input)] + [(f"--{flag}", path) for flag, path in files.items()]
    check_output_file("--output", args.output, inputs=inputs)
    check_text_start("--input", args.input)
    setup_logging(quiet=args.quiet)
    log = logging.getLogger("elmo_tf")

    from elmo_tf.embed.embedder import use_threads
    from elmo_tf.embed.score import score_file

    use_threads(args.threads)
    precision = resolved_precision(args.precision)
    lm = load(files, args.top_k, precision)
    notes = {flag: path for flag, path in files.items() if flag != "options"}
    notes["model"] = f"{files['options']}, {notes.pop('weights')}"
    start = time.perf_counter()
    progress = Progress("score", quiet=args.quiet, interval=args.log_interval, log=log)
    with journaled_run(args.output, log, FINGERPRINT_FLAGS, progress):
        stats = score_file(
            lm,
            args.input,
            args.output,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            progress=progress.update,
            max_tokens=args.max_sentence_tokens,
            resume=args.resume,
            shard_tokens=args.shard_tokens,
            on_start=progress.start,
            notes=notes,
        )
    seconds = time.perf_counter() - start
    log.info(
        "%d sentences, %d tokens in %.1f s (%.1f sentences/s in this run); %d cut to %d tokens; %d of %d shards "
        "resumed; computed in %s; wrote %s",
        stats["sentences"],
        stats["tokens"],
        seconds,
        (stats["sentences"] - stats["resumed_sentences"]) / max(seconds, 1e-9),
        stats["truncated"],
        args.max_sentence_tokens,
        stats["resumed_shards"],
        stats["shards"],
        precision_text(precision, args.precision),
        args.output,
    )
    return 0
