"""What the long-running commands (`embed`, `score`, `merge-shards`) share: their progress on stderr, their resume
flags, and the lines they print when a resume is refused or a run is interrupted (`elmo_tf.io.journal`)."""

import contextlib
import datetime
import logging
import os
import sys
import time

from elmo_tf.cli import DataError, UsageError, bounded_number, raised_by_sigterm, size_int


class Progress:
    """A command's progress on stderr: a bar with the total, the rate and the time left on a terminal (tqdm); a log
    line every `interval` seconds otherwise (a file, a pipe, a scheduler's log); nothing with `quiet`.

    `start(total, done)` is called once (the library's `on_start`: the input's lines, those a resumed run already
    has); `update(n)` after each batch; `close()` at the end. The rate counts this run's sentences only. `name`
    starts each line and labels the bar.
    """

    def __init__(self, name, quiet=False, interval=30.0, stream=None, log=None):
        self.name = name
        self.quiet = quiet
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.log = log or logging.getLogger("elmo_tf")
        self.bar = None
        self.total = self.done = self.initial = 0
        self.started = self.logged = None

    def start(self, total, done):
        self.total, self.done, self.initial = total, done, done
        self.started = self.logged = time.monotonic()
        if self.quiet:
            return
        if done:
            self.log.info("resuming: %d of %d sentences already written", done, total)
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            from tqdm import tqdm

            try:  # a terminal that reports no width (a fresh pty) would get an empty bar
                width = None if os.get_terminal_size(self.stream.fileno()).columns else 100
            except (OSError, ValueError, AttributeError):
                width = None
            self.bar = tqdm(
                total=total, initial=done, unit="sent", desc=self.name, file=self.stream, smoothing=0.1, ncols=width
            )

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if not self.quiet and self.started is not None and now - self.logged >= self.interval:
            self.logged = now
            self.log.info("%s", self.line(now))

    def line(self, now=None):
        """A line such as "embed: 1200/5000 sentences (24.0%), 85.3 sentences/s, ETA 0:00:44"."""
        elapsed = (now if now is not None else time.monotonic()) - self.started
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        share = 100.0 * self.done / self.total if self.total else 100.0
        left = f"{datetime.timedelta(seconds=round((self.total - self.done) / rate))}" if rate > 0 else "unknown"
        return f"{self.name}: {self.done}/{self.total} sentences ({share:.1f}%), {rate:.1f} sentences/s, ETA {left}"

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def add_resume_flags(parser, shard_tokens, what="option that changes the output"):
    """Adds --resume, --shard-tokens (default `shard_tokens`), --quiet and --log-interval to `parser`; `what` ends
    --resume's help ("refused when the input, model or an option that ... differs")."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run of this command into the same --output: its finished shards are kept, "
        f"the rest computed (refused when the input, model or an {what} differs)",
    )
    parser.add_argument(
        "--shard-tokens",
        type=size_int("--shard-tokens"),
        default=shard_tokens,
        help=f"tokens per resumable shard ({shard_tokens}): a kill loses at most one shard of work",
    )
    add_progress_flags(parser)


def add_progress_flags(parser):
    """Adds --quiet and --log-interval (a `Progress`'s) to `parser`."""
    parser.add_argument("--quiet", action="store_true", help="no progress and no log lines, only errors")
    parser.add_argument(
        "--log-interval",
        type=bounded_number("--log-interval", float, minimum=0, minimum_inclusive=False, maximum=86400),
        default=30.0,
        help="seconds between progress lines when stderr is not a terminal (30)",
    )


def refused_resume(error, output, flags):
    """`UsageError` naming each difference of a `ResumeRefused` by its flag (`flags`: `{fingerprint name: flag}`),
    with both values."""
    shown = "; ".join(f"{flags.get(name, name)}: {then} then, {now} now" for name, then, now in error.differences)
    return UsageError(
        f"--resume: the partial run of {output!r} differs from this command: {shown} "
        "(run without --resume to start over)"
    )


def resume_hint(output):
    """Where the finished shards of an interrupted run are kept and how to go on, or None when there are none (the
    journal then removes itself: nothing is left beside the output)."""
    from elmo_tf.io.journal import finished_shards, state_dir_of

    state = state_dir_of(output)
    try:
        kept = len(finished_shards(state))
    except OSError:
        return None
    if not kept:
        return None
    return f"the finished shards are kept in {state}: the same command with --resume goes on from them ({kept} kept)"


@contextlib.contextmanager
def journaled_run(output, log, flags, progress):
    """Runs the body of a journaled command (`embed`, `score`) under the CLI contract: a refused resume names each
    difference by its flag (`flags`), a journal whose shards do not fit the run a usage error naming --resume,
    another run's journal or a foreign one is a usage error naming --output, an
    input changed or unreadable a data error naming --input, a full disk a data error naming --output; after a full
    disk (in its error line), Ctrl-C or SIGTERM (a warning), `resume_hint` says where the finished shards are kept.
    `progress` is closed at the end."""
    from elmo_tf.io.atomic import WriteError
    from elmo_tf.io.journal import JournalBusy, JournalMismatch, NotAJournal, ResumeRefused
    from elmo_tf.io.text import TextFileError

    try:
        yield
    except ResumeRefused as e:
        raise refused_resume(e, output, flags) from None
    except (JournalBusy, NotAJournal) as e:  # another run's journal, or files no run wrote: pick another output
        raise UsageError(f"--output: {e}") from None
    except JournalMismatch as e:  # shards the plan has no place for: the journal is kept, the line says what to do
        raise UsageError(f"--resume: {e}") from None
    except TextFileError as e:
        raise DataError(f"--input: {e}") from None
    except WriteError as e:  # a full disk: the temporary is removed, an existing output kept, finished shards too
        hint = resume_hint(output)
        raise DataError(f"--output: {e}" + (f"; {hint}" if hint else "")) from None
    except BaseException as e:
        # Ctrl-C, SIGTERM, or SIGTERM's exit replaced by the error of a context manager it unwound through (TensorFlow's
        # and h5py's can raise in `__exit__`): `run` then exits 143 all the same, and the hint must still be said
        if isinstance(e, (KeyboardInterrupt, SystemExit)) or raised_by_sigterm(e):
            hint = resume_hint(output)
            if hint:
                log.warning("%s", hint)
        raise
    finally:
        progress.close()
