"""`embed` and `dump-token-embeddings`: `elmo-tf embed ...` / `elmo-tf embed ...` (`elmo_tf.cli.main`).

Errors follow `elmo_tf.cli`: a bad flag, a missing input or an output that cannot be written exits 2 before
anything is loaded; a bad options.json, weight file or input file exits 1; each with one line naming the flag
and the file (and the line or key, for data). The flags `beam-embed` shares with embed are written once here
(`add_embed_flags`, `check_embed_flags`, `embed_settings`).
"""

import argparse
import logging
import sys
import time

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    check_output_file,
    check_text_start,
    existing_file,
    setup_logging,
    size_int,
    threads_int,
)
from elmo_tf.cli.models import MODEL_HELP, resolve_model
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision
from elmo_tf.cli.progress import Progress, add_resume_flags, journaled_run
from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS

PROG = "elmo-tf embed"
DUMP_PROG = "elmo-tf dump-token-embeddings"

EXAMPLES = """examples:
  elmo-tf embed --options options.json --weights weights.hdf5 --input sentences.txt --output out.hdf5
  elmo-tf embed --options options.json --weights weights.hdf5 --input s.txt --output top.hdf5 \\
      --layers top --batch-size 32
  elmo-tf embed ... --output out.hdf5 --dtype float16      # half the file
  elmo-tf embed ... --output out.hdf5 --resume             # after a crash: the same command, plus --resume
  elmo-tf embed ... --output out.hdf5 --precision auto     # bfloat16 where the CPU has AVX512_BF16 or AMX

  elmo-tf dump-token-embeddings --options options.json --weights weights.hdf5 --vocab vocab.txt \\
      --output tokens.hdf5
  elmo-tf embed --options options.json --weights weights.hdf5 --input s.txt --output out.hdf5 \\
      --token-embeddings tokens.hdf5 --vocab vocab.txt       # the char CNN only for words not in vocab.txt

input: one whitespace-tokenized sentence per line (split on ASCII whitespace; bytes kept as they are; a UTF-8
byte order mark is skipped; an empty file, a UTF-16 file or one with NUL bytes is refused). The file is read
once, as a stream: memory does not grow with its size (except for the sentence_to_index keys).
output: dataset "<line index>" per line: (L+1, n_tokens, 2P) for --layers all, (n_tokens, 2P) for top and
average; "sentence_to_index": a JSON string {key: "line index"} (AllenNLP's format; left out with
--no-sentence-index). A key is the line decoded as UTF-8 with ASCII whitespace stripped from its ends: AllenNLP's
key for UTF-8 lines; invalid bytes become lone surrogates ("\\udcXX" in the JSON; key.encode("utf-8",
"surrogateescape") gives the bytes back), so two lines with different tokens never share a key.
The file's attribute precision says what the vectors were computed in (float32 or bfloat16, --precision).
Empty lines give a dataset with 0 tokens. A line of more than --max-sentence-tokens tokens is split into
consecutive pieces of that many, each embedded as a sentence of its own (between its own <S> and </S>); its
dataset holds every token's vector, the pieces' in order (the file's attributes max_sentence_tokens and
long_sentences="split" say so). A model call holds at most --max-batch-tokens positions (or one piece), so memory
and the wait of SIGTERM do not grow with a line. Short sentences share a packed row (each between its own <S>
and </S>, the LSTM state reset between them): outputs are stateless, a sentence gets the same vectors whatever
it is batched with.
resume: the work is written as it is done, in shards of about --shard-tokens tokens, to a hidden directory
beside the output (.<output name>.partial/); the output is built from them at the end and the directory removed.
An interrupted run (kill -9, SIGTERM: exit 143, Ctrl-C: exit 130, a full disk: exit 1) leaves an existing output
as it was and keeps its finished shards: the same command with --resume computes only the rest and writes the
same file as an uninterrupted run. It is refused (exit 2, naming each difference) when the input's content, the
model, the token cache, --precision or an option that changes the output differs; without --resume a run starts
over.
progress: on a terminal a bar with the total, the rate and the time left; otherwise a log line every
--log-interval seconds; nothing with --quiet.
"""


def add_embed_flags(parser, output_help, remote_paths=False):
    """Adds the flags that `embed` and `beam-embed` share to `parser`: the model (--options, --weights), --input,
    --output (its help `output_help`: a file or a shard prefix), the token cache, and every option of the packing, the
    model run and the written datasets. `embed_settings` turns them into the library's arguments and
    `check_embed_flags` checks what argparse cannot.

    With `remote_paths` (beam-embed), the input paths may be of any Beam filesystem: argparse takes them as they are
    (the command checks them, through Beam for a remote one) and their help says so; otherwise each must be an
    existing file.
    """
    where = " (local or a Beam filesystem)" if remote_paths else ""

    def path(flag):
        return None if remote_paths else existing_file(flag)

    _add_input_flags(parser, output_help, remote_paths, where, path)
    _add_packing_flags(parser)
    _add_output_flags(parser, where, path)


def _add_input_flags(parser, output_help, remote_paths, where, path):
    """`add_embed_flags`' model and paths: --options, --weights, --model (local only), --input, --output."""
    model_help = "" if remote_paths else " (or --model)"
    parser.add_argument(
        "--options",
        required=remote_paths,
        type=path("--options"),
        help=f"bilm-tf/AllenNLP options.json{where}{model_help}",
    )
    parser.add_argument(
        "--weights",
        required=remote_paths,
        type=path("--weights"),
        help=f"bilm-tf/AllenNLP weights.hdf5{where}{model_help}",
    )
    if not remote_paths:
        parser.add_argument("--model", metavar="NAME|DIR|URL", help=f"instead of --options/--weights: {MODEL_HELP}")
    parser.add_argument(
        "--input",
        required=True,
        type=path("--input"),
        help=f"text file, one whitespace-tokenized sentence per line{where}",
    )
    parser.add_argument("--output", required=True, help=output_help)


def _add_packing_flags(parser):
    """`add_embed_flags`' packing and model-run flags: the batch size, the layers, the token caps, the sort."""
    parser.add_argument(
        "--batch-size",
        type=size_int("--batch-size"),
        default=64,
        help="packed rows per batch, the width of the LSTM's matmuls (64); a row holds several short sentences",
    )
    parser.add_argument("--layers", choices=("all", "top", "average"), default="all", help="what to write (all)")
    parser.add_argument(
        "--max-batch-tokens",
        type=size_int("--max-batch-tokens"),
        default=None,
        help="cap on rows x steps per batch, what one model call holds (default 128 x batch size, fewer for a big "
        "model: about 4 s of work, the time SIGTERM may wait; 2,905 for the original model)",
    )
    parser.add_argument(
        "--max-sentence-tokens",
        type=size_int("--max-sentence-tokens"),
        default=DEFAULT_MAX_SENTENCE_TOKENS,
        help="split a longer line into consecutive pieces of this many tokens, each embedded as a sentence of its "
        f"own; every token keeps its vector ({DEFAULT_MAX_SENTENCE_TOKENS})",
    )
    parser.add_argument(
        "--no-sort",
        action="store_true",
        help="batch in file order (one batch of look-ahead) instead of by length within windows of 50 x batch size",
    )


def _add_output_flags(parser, where, path):
    """`add_embed_flags`' token cache and written-dataset flags, with the threads and the written dtype."""
    parser.add_argument(
        "--token-embeddings",
        type=path("--token-embeddings"),
        default=None,
        help=f"cached token vectors (bilm-tf/AllenNLP layout, from dump-token-embeddings); needs --vocab{where}",
    )
    parser.add_argument(
        "--vocab",
        type=path("--vocab"),
        default=None,
        help=f"the vocabulary of --token-embeddings, one token per line{where}",
    )
    parser.add_argument(
        "--no-sentence-index",
        action="store_true",
        help="do not write sentence_to_index (AllenNLP's --forget-sentences): memory then holds no keys",
    )
    parser.add_argument(
        "--threads",
        type=threads_int("--threads"),
        default=0,
        help="TensorFlow intra- and inter-op threads per process (0: TensorFlow's default)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="of the written vectors (float32); float16 halves the output (computed in float32, rounded at the end)",
    )


def check_embed_flags(args):
    """Raises `UsageError` for what the flags of `add_embed_flags` cannot say alone: --token-embeddings without
    --vocab, or the reverse."""
    if (args.token_embeddings is None) != (args.vocab is None):
        given, missing = ("--token-embeddings", "--vocab") if args.vocab is None else ("--vocab", "--token-embeddings")
        raise UsageError(f"{given} needs {missing} (the cache's rows follow the vocabulary's lines)")


def model_flags(args, quiet=False):
    """--model, or both --options and --weights (UsageError otherwise); --model sets the two to its files."""
    given = [flag for flag in ("--options", "--weights") if getattr(args, flag[2:])]
    if args.model is not None:
        if given:
            raise UsageError(f"--model: not allowed with {', '.join(given)}")
        files = resolve_model("--model", args.model, quiet=quiet)
        args.options, args.weights = files["options"], files["weights"]
    elif len(given) < 2:
        missing = [flag for flag in ("--options", "--weights") if flag not in given]
        raise UsageError(f"{' and '.join(missing)}: required (or --model NAME|DIR|URL)")


def embed_settings(args):
    """The keyword arguments that the flags of `add_embed_flags` give `elmo_tf.embed.embed_file` (and the Beam
    pipeline's `ShardedEmbedConfig`): how sentences are packed and what is written."""
    return {
        "batch_size": args.batch_size,
        "layers": args.layers,
        "max_batch_tokens": args.max_batch_tokens,
        "max_sentence_tokens": args.max_sentence_tokens,
        "sort": not args.no_sort,
        "sentence_index": not args.no_sentence_index,
        "dtype": args.dtype,
    }


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description="Write ELMo activations for every sentence of a file (like bilm-tf's "
        "dump_bilm_embeddings and AllenNLP's `elmo --all`).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_embed_flags(p, "hdf5 file to write (replaced whole at the end)")
    add_precision_flag(p)
    add_resume_flags(p, 50_000)
    return p


TOKEN_EMBEDDINGS_EPILOG = """example:
  elmo-tf dump-token-embeddings --options options.json --weights weights.hdf5 --vocab vocab.txt \\
      --output token_embeddings.hdf5

vocab: one token per line (UTF-8 bytes kept as they are; no empty line, no whitespace inside a token, no
duplicate; <S> and </S> get the sentence-boundary vectors).
output: dataset "embedding", float32 (vocabulary size, projection_dim), row j = line j + 1 of the vocabulary:
the layout of bilm-tf's dump_token_embeddings and AllenNLP's vocab_to_cache (readers prepend a zero row for
padding). Attributes vocabulary_size and vocabulary_sha256 record the vocabulary it was written for.
"""


def build_dump_parser(prog=DUMP_PROG):
    p = ArgumentParser(
        prog=prog,
        description="Write the char-CNN token vector of every word of a vocabulary (like bilm-tf's "
        "dump_token_embeddings and AllenNLP's vocab_to_cache).",
        epilog=TOKEN_EMBEDDINGS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--options", type=existing_file("--options"), help="bilm-tf/AllenNLP options.json (or --model)")
    p.add_argument("--weights", type=existing_file("--weights"), help="bilm-tf/AllenNLP weights.hdf5 (or --model)")
    p.add_argument("--model", metavar="NAME|DIR|URL", help=f"instead of --options/--weights: {MODEL_HELP}")
    p.add_argument("--vocab", required=True, type=existing_file("--vocab"), help="vocabulary file, one token per line")
    p.add_argument("--output", required=True, help="hdf5 file to write (replaced whole at the end)")
    p.add_argument("--batch-size", type=size_int("--batch-size"), default=1024, help="tokens per char-CNN call (1024)")
    return p


def dump_main(argv=None, prog=DUMP_PROG):
    """`dump-token-embeddings`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_dump_parser(prog).parse_args(argv)
    model_flags(args)
    # usage errors first, then the vocabulary, before the model is loaded
    inputs = (("--vocab", args.vocab), ("--options", args.options), ("--weights", args.weights))
    check_output_file("--output", args.output, inputs=inputs)
    from elmo_tf.io.token_embeddings import (
        TokenEmbeddingError,
        compute_token_embeddings,
        read_vocabulary,
        write_token_embeddings,
    )

    try:
        tokens = read_vocabulary(args.vocab)
    except TokenEmbeddingError as e:
        raise DataError(f"--vocab: {e}") from None
    setup_logging()
    log = logging.getLogger("elmo_tf")
    from tqdm import tqdm

    from elmo_tf.config import ConfigError
    from elmo_tf.io import WeightFileError
    from elmo_tf.models import load_elmo

    try:
        model = load_elmo(args.options, args.weights)
    except ConfigError as e:
        raise DataError(f"--options: {e}") from None
    except WeightFileError as e:
        raise DataError(f"--weights: {e}") from None
    from elmo_tf.io.atomic import WriteError

    start = time.perf_counter()
    with tqdm(total=len(tokens), unit="tok", file=sys.stderr, desc="dump-token-embeddings") as bar:
        embedding = compute_token_embeddings(model, tokens, batch_size=args.batch_size, progress=bar.update)
    try:
        write_token_embeddings(args.output, embedding, vocabulary=tokens)
    except WriteError as e:  # a full disk: the temporary is removed, an existing output kept
        raise DataError(f"--output: {e}") from None
    seconds = time.perf_counter() - start
    log.info("%d tokens in %.1f s; wrote %s (%d x %d)", len(tokens), seconds, args.output, *embedding.shape)
    return 0


# the flag that sets each entry of embed_file's fingerprint (named when a resume is refused)
FINGERPRINT_FLAGS = {
    "input": "--input",
    "model": "--options/--weights",
    "precision": "--precision",
    "token_embeddings": "--token-embeddings/--vocab",
    "layers": "--layers",
    "dtype": "--dtype",
    "batch_size": "--batch-size",
    "max_batch_tokens": "--max-batch-tokens",
    "sort": "--no-sort",
    "max_sentence_tokens": "--max-sentence-tokens",
    "long_sentences": "elmo-tf's version (long lines were handled otherwise)",
    "sentence_index": "--no-sentence-index",
    "shard_tokens": "--shard-tokens",
    "threads": "--threads",
    "tensorflow": "TensorFlow version",
}


def input_files(args):
    """`(flag, path)` of every file `embed` and `beam-embed` read, which their output must not be."""
    flags = ("--input", "--options", "--weights", "--token-embeddings", "--vocab")
    return tuple((flag, getattr(args, flag[2:].replace("-", "_"))) for flag in flags)


def main(argv=None, prog=PROG):
    """`embed`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_parser(prog).parse_args(argv)
    # everything that can be checked is checked before TensorFlow and the model are loaded; the input itself is
    # read once, while embedding (a bad line further down exits 1 naming it, and no output is left)
    check_embed_flags(args)
    model_flags(args, quiet=args.quiet)
    check_output_file("--output", args.output, inputs=input_files(args))
    check_text_start("--input", args.input)
    setup_logging(quiet=args.quiet)
    log = logging.getLogger("elmo_tf")

    from elmo_tf.config import ConfigError
    from elmo_tf.embed import embed_file, limit_malloc_arenas
    from elmo_tf.embed.embedder import use_threads
    from elmo_tf.io import WeightFileError
    from elmo_tf.io.token_embeddings import TokenEmbeddingError, load_token_embeddings, read_vocabulary
    from elmo_tf.models import load_elmo

    limit_malloc_arenas()  # before TensorFlow's threads allocate: about 100 MB less peak RSS
    use_threads(args.threads)
    precision = resolved_precision(args.precision)
    try:
        model = load_elmo(args.options, args.weights, precision=precision)
    except ConfigError as e:
        raise DataError(f"--options: {e}") from None
    except WeightFileError as e:
        raise DataError(f"--weights: {e}") from None
    token_embeddings = None
    if args.vocab is not None:
        try:
            vocabulary = read_vocabulary(args.vocab)
        except TokenEmbeddingError as e:
            raise DataError(f"--vocab: {e}") from None
        try:
            token_embeddings = (
                vocabulary,
                load_token_embeddings(args.token_embeddings, vocabulary, projection_dim=model.config.projection_dim),
            )
        except TokenEmbeddingError as e:
            raise DataError(f"--token-embeddings: {e}") from None
    notes = {"model": f"{args.options}, {args.weights}"}
    if args.vocab is not None:
        notes["token_embeddings"] = f"{args.token_embeddings}, {args.vocab}"
    start = time.perf_counter()
    progress = Progress("embed", quiet=args.quiet, interval=args.log_interval, log=log)
    with journaled_run(args.output, log, FINGERPRINT_FLAGS, progress):
        stats = embed_file(
            model,
            args.input,
            args.output,
            **embed_settings(args),
            progress=progress.update,
            token_embeddings=token_embeddings,
            resume=args.resume,
            shard_tokens=args.shard_tokens,
            on_start=progress.start,
            notes=notes,
        )
    log_summary(log, stats, time.perf_counter() - start, args, precision_text(precision, args.precision))
    return 0


def log_summary(log, stats, seconds, args, precision):
    """`embed`'s last log line: the counts of `stats` (`embed_file`'s), the time, the precision, the output."""
    log.info(
        "%d sentences, %d tokens (%d embedded in this run) in %.1f s (%.0f tokens/s); %d empty, %d split in pieces "
        "of %d tokens; "
        "%d of %d shards resumed; %d distinct tokens per batch through the char CNN, %d from the cache; computed in "
        "%s; wrote %s",
        stats["sentences"],
        stats["tokens"],
        stats["computed_tokens"],
        seconds,
        stats["computed_tokens"] / max(seconds, 1e-9),
        stats["empty"],
        stats["split"],
        args.max_sentence_tokens,
        stats["resumed_shards"],
        stats["shards"],
        stats["distinct"] - stats["cached"],
        stats["cached"],
        precision,
        args.output,
    )
