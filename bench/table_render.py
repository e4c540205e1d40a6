"""How a benchmark table is rendered: a `Table` says which runs of a history it shows, which rows of them, its
`Column`s (header, cell, alignment) and its caption; `render_table` turns one into Markdown. The tables themselves
are data in bench/speed_tables.py, corpus_tables.py and quality_tables.py. The standard library only."""

import dataclasses
from collections.abc import Callable

DASH = "-"


# ------------------------------------------------------------------------------------------------ formatting


def fmt(value, spec="", none=DASH):
    """`value` formatted with `spec` (a format spec such as ",.0f"), `none` for None; strings as they are."""
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return format(value, spec)


def raw(value, none=DASH):
    """A transcribed number as it was recorded (13.0 stays "13.0", 108 stays "108"), `none` for None."""
    return none if value is None else str(value)


def pct(fraction, none=DASH):
    """A fraction as a whole percentage ("71%"), `none` for None."""
    return none if fraction is None else f"{fraction:.0%}"


def times(ratio, spec=".2f", none=DASH):
    """A ratio as "2.13x", `none` for None."""
    return none if ratio is None else f"{ratio:{spec}}x"


def sci(value, none=DASH):
    """A small number in the notation of the prose ("9.5e-07"), `none` for None."""
    return none if value is None else f"{value:.1e}"


def pair(a, b, spec=",.0f", sep=" / "):
    """Two values as "a / b", DASH for a missing one; DASH alone when both are missing."""
    if a is None and b is None:
        return DASH
    return f"{fmt(a, spec)}{sep}{fmt(b, spec)}"


def escape(text):
    """`text` safe in Markdown prose: "<" as "&lt;" (so "<S>" is text, not an HTML tag)."""
    return text.replace("<", "&lt;")


def cell_text(cell):
    """A table cell's Markdown: "|" escaped, and "<" too outside a code span."""
    text = str(cell).replace("|", "\\|")
    return text if text.startswith("`") else escape(text)


def markdown_table(headers, rows, align=None):
    """A Markdown table (a list of lines) of `headers` and `rows` (lists of strings); `align` one of "l"/"r" per
    column (text left, numbers right by default: every column after the first right-aligned)."""
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align: {len(align)} entries for {len(headers)} headers")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"rows: a row of {len(row)} cells for {len(headers)} headers: {row!r}")
        lines.append("| " + " | ".join(cell_text(c) for c in row) + " |")
    return lines


# ------------------------------------------------------------------------------------------------ runs


def when(run):
    """A run's date, with "?" when unrecorded."""
    return run.get("date") or "?"


def roof(run):
    """A run's roofline for a table cell."""
    return fmt(run.get("roofline_gflops"), ".0f")


def latest(history, **match):
    """The newest run of `history` whose fields equal `match`; ValueError naming the benchmark when none does."""
    found = select(history, **match)
    if not found:
        raise ValueError(f"history {history['benchmark']!r}: no run with {match!r}")
    return found[-1]


def select(history, **match):
    """Every run of `history` whose fields equal `match`, oldest first."""
    return [r for r in history["runs"] if all(r.get(k) == v for k, v in match.items())]


def of_kinds(*kinds):
    """A runs selector: every run of one of `kinds`, in the history's order."""
    return lambda h: [r for r in h["runs"] if r.get("kind") in kinds]


def newest(**match):
    """A runs selector: the newest run whose fields equal `match` (ValueError when none does)."""
    return lambda h: [latest(h, **match)]


def newest_with(predicate):
    """A runs selector: the newest run for which `predicate(run)` holds."""
    return lambda h: [[r for r in h["runs"] if predicate(r)][-1]]


def every_run(h):
    """A runs selector: every run, oldest first."""
    return h["runs"]


def each_row(h, runs):
    """A rows expander: `(run, row)` for every row of `runs`."""
    return [(run, r) for run in runs for r in run["rows"]]


def measured(measure):
    """A rows expander: `(run, row)` for every row of the runs that measured `measure` (`row["measure"]`)."""
    return lambda h, runs: [(run, r) for run, r in each_row(h, runs) if r["measure"] == measure]


def runs_of(pairs):
    """The runs the `(run, row)` pairs come from, each once, in order."""
    return list({id(run): run for run, _ in pairs if run is not None}.values())


# ------------------------------------------------------------------------------------------------ captions


def roofline_text(run):
    """The caption's roofline of `run`: "220 GFLOP/s (float32 matmul)", with the bfloat16 one where measured, or
    what the run records instead ("not measured in this run")."""
    if run.get("roofline_gflops") is None:
        return run.get("roofline_note") or "not measured in this run"
    text = f"{run['roofline_gflops']:.0f} GFLOP/s (float32 matmul)"
    if run.get("low_precision_roofline_gflops"):
        text += f", {run['low_precision_roofline_gflops']:.0f} GFLOP/s bfloat16"
    return text


def run_label(run):
    """A short name of `run` for captions: its commit, else its session, else its date, else "undated"."""
    if run.get("commit"):
        return run["commit"]
    if run.get("session") is not None:
        return f"session {run['session']}"
    return run.get("date") or "undated"


def caption(history, run, command=None):
    """The line under a table that shows one run: commit, date, CPU, roofline, and the command to rerun."""
    date = run.get("date") or "date unrecorded"
    if run.get("date_note") and run.get("date"):
        date += f" ({run['date_note']})"
    session = f", session {run['session']}" if run.get("session") is not None else ""
    command = command or run.get("command") or history["command"]
    return (
        f"*Commit {run.get('commit') or 'unrecorded'}, {date}{session}; CPU: {run['cpu']}; roofline: "
        f"{roofline_text(run)}. Rerun: `{command}`. Source: `bench/results/history/{history['benchmark']}.json`.*"
    )


def caption_runs(history, runs, command=None):
    """The line under a table of several runs: each CPU with the runs it ran, and the command to rerun."""
    by_cpu = {}
    for run in runs:
        by_cpu.setdefault(run["cpu"], []).append(run_label(run))
    if len(by_cpu) == 1:
        cpus = next(iter(by_cpu))
    else:
        cpus = "; ".join(f"{cpu} ({', '.join(dict.fromkeys(labels))})" for cpu, labels in by_cpu.items())
    return (
        f"*One row per run and measurement, oldest first; commit, date and roofline per row (float32 matmul GFLOP/s; "
        f"{DASH}: not recorded). CPU: {cpus}. Rerun: `{command or history['command']}`. Source: "
        f"`bench/results/history/{history['benchmark']}.json`.*"
    )


def the_run(prefix=""):
    """A caption: `prefix` (formatted with the history `h` and the run `run`) and the one run's caption."""
    return lambda h, runs, pairs: [prefix.format(h=h, run=runs[-1]) + caption(h, runs[-1])]


def the_runs(prefix="", shown=False):
    """A caption: `prefix` (formatted with the history `h`) and the caption of the selected runs (of the runs whose
    rows the table shows when `shown`)."""
    return lambda h, runs, pairs: [prefix.format(h=h) + caption_runs(h, runs_of(pairs) if shown else runs)]


# ------------------------------------------------------------------------------------------------ tables


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its `header` (a string, or `(history, runs) -> str`), its `cell` (`(run, row) -> str`) and its
    alignment ("l" text, "r" numbers)."""

    header: object
    cell: Callable
    align: str = "r"


@dataclasses.dataclass(frozen=True)
class Table:
    """A table as data. `benchmark`: the history it reads (None: every history, as a list). `columns`: a sequence of
    `Column`, or `(history, runs) -> columns` where they depend on the runs. `runs`: `history -> runs shown`.
    `rows`: `(history, runs) -> [(run, row)]`, one per table row. `caption`: `(history, runs, pairs) -> lines`."""

    benchmark: object
    columns: object
    runs: Callable = every_run
    rows: Callable = each_row
    caption: Callable = the_runs()


def render_table(table, history):
    """The lines of `table` rendered from `history`: the Markdown table, a blank line, the caption."""
    runs = table.runs(history)
    pairs = table.rows(history, runs)
    columns = table.columns(history, runs) if callable(table.columns) else table.columns
    headers = [c.header(history, runs) if callable(c.header) else c.header for c in columns]
    rows = [[c.cell(run, r) for c in columns] for run, r in pairs]
    return markdown_table(headers, rows, [c.align for c in columns]) + [""] + table.caption(history, runs, pairs)


# ------------------------------------------------------------------------------------------------ columns

DATE = Column("date", lambda run, r: when(run), "l")
COMMIT = Column("commit", lambda run, r: fmt(run.get("commit")), "l")
ROW_COMMIT = Column("commit", lambda run, r: fmt(r.get("commit") or run.get("commit")), "l")


def text(header, key, align="l"):
    """A column whose cells are the rows' `key` as they are (rows made of display strings)."""
    return Column(header, lambda run, r: r[key], align)


def number(header, key, spec=",.0f", align="r"):
    """A column of the rows' `key` formatted with `spec`, DASH where missing."""
    return Column(header, lambda run, r: fmt(r.get(key), spec), align)


def join(*names):
    """Display strings of the rows' `names` joined as "a / b / c", each to one decimal."""
    return lambda run, r: " / ".join(fmt(r[k], ".1f") for k in names)
