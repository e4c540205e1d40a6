"""The benchmark tables of README.md, docs/ and bench/README.md, generated from bench/results/history/*.json.

Each history file holds one benchmark's runs, oldest first: `{"benchmark", "command", "runs": [RUN, ...]}`, a RUN
naming its `date`, `commit`, `cpu`, `roofline_gflops` (float32 matmul GFLOP/s of that run, or null), `session`,
`source` and its measured `rows`. A table is marked in a Markdown file as

    <!-- bench-table: ID -->
    <!-- /bench-table -->

and this script writes the rendering of table ID between the two markers:

    python bench/tables.py --write                 # rewrite every marked region
    python bench/tables.py --check                 # exit 1 naming each region that differs, or an unknown ID
    python bench/tables.py --list                  # the table IDs
    python bench/tables.py record NAME RESULT.json # append a bench script's --out JSON to NAME's history

The standard library and elmo_tf.machine only: no TensorFlow, well under a second.
"""

import argparse
import glob
import os
import re
import sys

from corpus_tables import CORPUS_TABLES
from history import HISTORY, REPO, REQUIRED_RUN_KEYS, history_names, load_history, record  # noqa: F401 (the API)
from quality_tables import QUALITY_TABLES
from speed_tables import SPEED_TABLES
from table_render import DASH, Column, Table, render_table

from elmo_tf.io.atomic import write_text

MARKER = re.compile(r"<!-- bench-table: (?P<id>[^\s>]*) -->(?P<body>.*?)<!-- /bench-table -->", re.DOTALL)
OPENING = re.compile(r"<!-- bench-table: (?P<id>[^\s>]*) -->")


def durations_table(benchmark):
    """How long one run takes: of each benchmark (`benchmark` None: every history, as a list) or of one, from the
    `durations` of its history."""
    return Table(
        benchmark,
        [
            Column("script, mode", lambda h, d: f"`{d['mode']}`", "l"),
            Column("one run", lambda h, d: d["one_run"], "l"),
            Column("from", lambda h, d: d.get("from") or DASH, "l"),
        ],
        runs=lambda h: h if benchmark is None else [h],
        rows=lambda h, histories: [(one, d) for one in histories for d in one.get("durations", [])],
        caption=lambda h, runs, pairs: [
            "*From the `durations` of `bench/results/history/*.json`; 2 cores; estimates are marked. Run each "
            "benchmark alone, never beside the tests.*"
        ],
    )


BENCHMARKS = (
    "embed_throughput",
    "serving_latency",
    "train_throughput",
    "pretrain_ptb",
    "ner_quality",
    "lm_score",
    "peer_parity",
    "embed_resume",
    "beam_throughput",
)
TABLES = {
    **SPEED_TABLES,
    **CORPUS_TABLES,
    **QUALITY_TABLES,
    "durations": durations_table(None),
    **{f"{name}_durations": durations_table(name) for name in BENCHMARKS},
}


def render(table_id, history_dir=HISTORY):
    """The Markdown of table `table_id` (no trailing newline); ValueError naming the ID when it is unknown."""
    if table_id not in TABLES:
        raise ValueError(f"table ID {table_id!r}: unknown (known: {', '.join(sorted(TABLES))})")
    table = TABLES[table_id]
    if table.benchmark is None:
        history = [load_history(n, history_dir) for n in history_names(history_dir)]
    else:
        history = load_history(table.benchmark, history_dir)
    return "\n".join(render_table(table, history))


# ------------------------------------------------------------------------------------------------ marked regions


def marked_files(repo=REPO):
    """The Markdown files whose marked regions are tables: README.md, bench/README.md, docs/**/*.md (those that
    exist), sorted."""
    paths = [os.path.join(repo, "README.md"), os.path.join(repo, "bench", "README.md")]
    paths += glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True)
    return sorted(p for p in paths if os.path.isfile(p))


def region_body(rendered):
    """What --write puts between a region's two markers for a table rendered as `rendered`."""
    return f"\n\n{rendered}\n\n"


def rewrite(text, history_dir=HISTORY, path="<text>"):
    """`(text, problems, stale)`: `text` with every marked region replaced by its table; the problems met, "PATH:LINE:
    ..." lines for an unknown ID, a table that cannot be rendered, or an opening marker without its closing one; and
    "PATH:LINE: ..." for each region whose body differed from its table."""
    problems, stale, cache = [], [], {}
    matched = {m.start() for m in MARKER.finditer(text)}
    for m in OPENING.finditer(text):
        if m.start() not in matched:
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{path}:{line}: bench-table {m['id']!r}: no closing <!-- /bench-table --> after it")

    def replace(m):
        table_id = m["id"]
        line = text.count("\n", 0, m.start()) + 1
        if table_id not in cache:
            try:
                cache[table_id] = region_body(render(table_id, history_dir))
            except ValueError as e:
                cache[table_id] = None
                problems.append(f"{path}:{line}: {e}")
        if cache[table_id] is None:
            return m.group(0)
        if m["body"] != cache[table_id]:
            stale.append(
                f"{path}:{line}: bench-table {table_id!r} differs from its rendering of bench/results/history "
                "(python bench/tables.py --write)"
            )
        return f"<!-- bench-table: {table_id} -->{cache[table_id]}<!-- /bench-table -->"

    return MARKER.sub(replace, text), problems, stale


def check(repo=REPO, history_dir=HISTORY):
    """The problems of every marked file of `repo`: rewrite()'s problems and its stale regions. An empty list when
    all agree."""
    problems = []
    for path in marked_files(repo):
        with open(path, encoding="utf-8") as f:
            _new, found, stale = rewrite(f.read(), history_dir, os.path.relpath(path, repo))
        problems += found + stale
    return problems


def write(repo=REPO, history_dir=HISTORY):
    """Rewrites every marked region of `repo`'s Markdown files; returns (the files changed, the problems met)."""
    changed, problems = [], []
    for path in marked_files(repo):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new, found, _stale = rewrite(text, history_dir, os.path.relpath(path, repo))
        problems += found
        if new != text:
            write_text(path, new)
            changed.append(os.path.relpath(path, repo))
    return changed, problems


# ------------------------------------------------------------------------------------------------ command line


def main(argv=None):
    """The command line; returns the exit status (0, 1 when --check finds a difference, 2 on a usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        p = argparse.ArgumentParser(prog="tables.py record", description="append a bench run to its history")
        p.add_argument("name", help="the benchmark (embed_throughput, serving_latency, train_throughput)")
        p.add_argument("result", help="the bench script's --out JSON")
        p.add_argument("--command", default=None, help="the command that ran (default: the history's)")
        p.add_argument("--note", default=None, help="a note kept with the run")
        p.add_argument("--history-dir", default=HISTORY, help=argparse.SUPPRESS)
        args = p.parse_args(argv[1:])
        try:
            run = record(args.name, args.result, args.history_dir, args.command, args.note)
        except ValueError as e:
            print(f"tables.py: error: {e}", file=sys.stderr)
            return 2
        print(f"recorded {args.name}: commit {run['commit']}, {run['date']}, {run['cpu']}, {len(run['rows'])} rows")
        return 0
    p = argparse.ArgumentParser(prog="tables.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every marked region")
    mode.add_argument("--check", action="store_true", help="exit 1 when a marked region differs from its table")
    mode.add_argument("--list", action="store_true", help="print the table IDs")
    mode.add_argument("--show", metavar="ID", help="print the rendering of table ID")
    p.add_argument("--repo", default=REPO, help=argparse.SUPPRESS)
    p.add_argument("--history-dir", default=HISTORY, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(TABLES))
        return 0
    if args.show:
        try:
            print(render(args.show, args.history_dir))
        except ValueError as e:
            print(f"tables.py: error: --show: {e}", file=sys.stderr)
            return 2
        return 0
    if args.write:
        changed, problems = write(args.repo, args.history_dir)
        for path in changed:
            print(f"wrote {path}")
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    problems = check(args.repo, args.history_dir)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
