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
import datetime
import glob
import json
import os
import re
import subprocess
import sys

from elmo_tf.io.atomic import write_json, write_text
from elmo_tf.machine import cpu_description

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HISTORY = os.path.join(HERE, "results", "history")

REQUIRED_RUN_KEYS = ("date", "commit", "cpu", "roofline_gflops", "source")
MARKER = re.compile(r"<!-- bench-table: (?P<id>[^\s>]*) -->(?P<body>.*?)<!-- /bench-table -->", re.DOTALL)
OPENING = re.compile(r"<!-- bench-table: (?P<id>[^\s>]*) -->")
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


def when(run):
    """A run's date, with "?" when unrecorded."""
    return run.get("date") or "?"


def roof(run):
    """A run's roofline for a table cell."""
    return fmt(run.get("roofline_gflops"), ".0f")


def latest(history, **match):
    """The newest run of `history` whose fields equal `match`; ValueError naming the benchmark when none does."""
    found = [r for r in history["runs"] if all(r.get(k) == v for k, v in match.items())]
    if not found:
        raise ValueError(f"history {history['benchmark']!r}: no run with {match!r}")
    return found[-1]


def select(history, **match):
    """Every run of `history` whose fields equal `match`, oldest first."""
    return [r for r in history["runs"] if all(r.get(k) == v for k, v in match.items())]


# ------------------------------------------------------------------------------------------------ renderers


def order_text(row):
    """An embed_throughput row's "batch, order" cell ("64, length-sorted", "64, sorted, +cache")."""
    order = {"sorted": "length-sorted", "corpus": "corpus order"}.get(row["order"], row["order"])
    if row.get("variant"):
        return f"{row['batch_size']}, {row['order']}, {row['variant']}"
    return f"{row['batch_size']}, {order}"


def render_embed_throughput(h):
    """The headline: the latest full run, ours against AllenNLP, one row per batch size and order."""
    run = latest(h, scope="full")
    rows = [
        [
            order_text(r),
            fmt(r["ours_tokens_per_s"], ",.0f"),
            fmt(r["peer_tokens_per_s"], ",.0f"),
            times(r["ratio"]),
            f"{fmt(r['ours_gflops'], '.0f')} ({pct(r['fraction_of_roofline'])})",
            pair(r["ours_peak_rss_mib"], r["peer_peak_rss_mib"]),
        ]
        for r in run["rows"]
        if not r.get("variant")
    ]
    headers = ["batch, order", "elmo_tf tok/s", "AllenNLP tok/s", "ratio", "elmo_tf GFLOP/s (% of roofline)",
               "peak RSS MiB, ours / AllenNLP"]  # fmt: skip
    return markdown_table(headers, rows) + ["", caption(h, run)]


def render_embed_throughput_full(h):
    """The latest full run, every row: the variants (no memo, +cache) and the share of real LSTM positions too."""
    run = latest(h, scope="full")
    rows = []
    for r in run["rows"]:
        if r.get("speedup_vs_default") is not None and r.get("ours_gflops") is None:
            gflops = f"({times(r['speedup_vs_default'])} the default)"
        else:
            gflops = f"{fmt(r['ours_gflops'], '.0f')} ({pct(r['fraction_of_roofline'])})"
        rows.append(
            [
                order_text(r),
                fmt(r["ours_tokens_per_s"], ",.0f"),
                fmt(r["peer_tokens_per_s"], ",.0f"),
                times(r["ratio"]),
                gflops,
                pair(r["ours_peak_rss_mib"], r["peer_peak_rss_mib"])
                if r["peer_peak_rss_mib"]
                else fmt(r["ours_peak_rss_mib"], ",.0f"),
                pct(r["row_fill"]),
            ]
        )
    headers = ["batch, order", "elmo_tf tok/s", "AllenNLP tok/s", "ratio", "elmo_tf GFLOP/s (% of roofline)",
               "RSS MiB ours / AllenNLP", "row fill"]  # fmt: skip
    matmul = run.get("matmul_gflops")
    lines = markdown_table(headers, rows) + ["", caption(h, run)]
    if matmul:
        sizes = "; ".join(f"{n}^3 {'/'.join(fmt(v, '.0f') for v in vals)}" for n, vals in matmul.items())
        lines[-1] = lines[-1][:-1] + f" Matmul GFLOP/s before/after the run: {sizes}.*"
    return lines


def render_embed_backends(h):
    """The latest --backend run: TensorFlow's Embedder, then `ELMo` itself on each Keras backend, per batch, order."""
    run = latest(h, scope="backends")
    rows = []
    for r in run["rows"]:
        what = "TensorFlow, the Embedder" if not r.get("variant") else f"{r['variant']}, ELMo itself"
        vs = times(r.get("ratio_vs_embedder")) if r.get("variant") else "1.00x"
        rows.append(
            [
                f"{r['batch_size']}, {r['order']}",
                what,
                fmt(r["ours_tokens_per_s"], ",.0f"),
                vs,
                f"{fmt(r['ours_gflops'], '.0f')} ({pct(r['fraction_of_roofline'])})",
                fmt(r["ours_peak_rss_mib"], ",.0f"),
            ]
        )
    headers = ["batch, order", "backend, path", "tok/s", "vs the Embedder", "GFLOP/s (% of roofline)", "peak RSS MiB"]
    return markdown_table(headers, rows) + ["", caption(h, run)]


def render_embed_throughput_history(h):
    """Every recorded run of embed_throughput, one row per measurement (ranges where only ranges are recorded)."""
    rows = []
    for run in h["runs"]:
        summary = run.get("summary") or {}
        if not run["rows"]:
            frac = f"{pct(summary.get('fraction_of_roofline_min'))}-{pct(summary.get('fraction_of_roofline_max'))}"
            ratio = f"{times(summary.get('ratio_min'))}-{times(summary.get('ratio_max'))}"
            rows.append([when(run), fmt(run.get("commit")), roof(run), "all", DASH, DASH, ratio, frac, DASH])
            continue
        for r in run["rows"]:
            frac = pct(r["fraction_of_roofline"])
            if r["fraction_of_roofline"] is None and "fraction_of_roofline_min" in summary and not r.get("variant"):
                frac = f"{pct(summary['fraction_of_roofline_min'])}-{pct(summary['fraction_of_roofline_max'])}"
            roofline = roof(run) if run.get("roofline_gflops") else run.get("roofline_note", DASH)
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    roofline,
                    order_text(r),
                    fmt(r["ours_tokens_per_s"], ",.0f"),
                    fmt(r["peer_tokens_per_s"], ",.0f"),
                    times(r["ratio"])
                    if r["ratio"] is not None
                    else times(r.get("speedup_vs_default"), none=DASH)
                    + (" the default" if r.get("speedup_vs_default") else ""),
                    frac,
                    pair(r["ours_peak_rss_mib"], r["peer_peak_rss_mib"])
                    if r["peer_peak_rss_mib"]
                    else fmt(r["ours_peak_rss_mib"], ",.0f"),
                ]
            )
    headers = ["date", "commit", "roofline", "batch, order", "elmo_tf tok/s", "AllenNLP tok/s", "ratio",
               "% of roofline", "RSS MiB ours / AllenNLP"]  # fmt: skip
    return markdown_table(headers, rows, ["l", "l"] + ["r"] * 7) + ["", caption_runs(h, h["runs"])]


TRANSPORTS = {
    "embed": "embed",
    "in-process": "in-process",
    "grpc": "gRPC",
    "grpc-nobatch": "gRPC, no batching",
    "grpc-nometrics": "gRPC, metrics off",
    "rest": "REST",
}


def render_serving_latency(h):
    """The latest full serving run: every transport at each client count, with its share of embed's tokens/s."""
    run = latest(h, kind="full")
    rows = [
        [
            TRANSPORTS.get(r["transport"], r["transport"]),
            fmt(r["clients"]),
            fmt(r["p50_ms"], ",.0f"),
            fmt(r.get("p99_ms"), ",.0f"),
            fmt(r["sentences_per_s"], ".1f"),
            fmt(r.get("tokens_per_s"), ",.1f"),
            pct(r.get("of_embed")),
            times(r.get("p50_over_in_process")),
        ]
        for r in run["rows"]
    ]
    headers = ["transport", "clients", "p50 ms", "p99 ms", "sentences/s", "tokens/s", "of embed", "p50 / in-process"]
    preset = run["rows"][0]["preset"] if run["rows"] else "?"
    return markdown_table(headers, rows) + ["", f"*Model: {preset}.* " + caption(h, run)]


def render_serving_latency_grid(h):
    """The earliest serving run: both models, 1 and 32 clients, p50 ms / sentences/s for each transport."""
    run = latest(h, kind="grid")
    cells = {(r["preset"], r["clients"], r["transport"]): r for r in run["rows"]}
    keys = list(dict.fromkeys((r["preset"], r["clients"]) for r in run["rows"]))
    transports = ["in-process", "grpc", "grpc-nobatch", "rest"]
    rows = []
    for preset, clients in keys:
        row = [preset, str(clients)]
        for t in transports:
            r = cells.get((preset, clients, t))
            row.append(DASH if r is None else f"{raw(r['p50_ms'])} / {raw(r['sentences_per_s'])}")
        rows.append(row)
    headers = ["model", "clients"] + [f"{TRANSPORTS[t]} p50 ms / sent/s" for t in transports]
    return markdown_table(headers, rows) + ["", caption(h, run)]


def render_serving_latency_issue12(h):
    """The --quick pair around issue 12 (request budget, aiohttp REST front, registry split): before / after."""
    runs = select(h, kind="quick")
    if len(runs) < 2:
        raise ValueError(f"history {h['benchmark']!r}: the issue-12 table needs two runs of kind 'quick'")
    before, after = runs[-2], runs[-1]
    index = {(r["transport"], r["clients"]): r for r in after["rows"]}
    rows = []
    for r in before["rows"]:
        a = index.get((r["transport"], r["clients"]), {})
        rows.append(
            [
                str(r["clients"]),
                TRANSPORTS.get(r["transport"], r["transport"]),
                f"{raw(r['p50_ms'])} / {raw(r['sentences_per_s'])}",
                f"{raw(a.get('p50_ms'))} / {raw(a.get('sentences_per_s'))}",
                pair(r.get("p50_over_in_process"), a.get("p50_over_in_process"), ".2f", " -> "),
            ]
        )
    headers = ["clients", "transport", f"{before['label']}: p50 ms / sent/s", f"{after['label']}: p50 ms / sent/s",
               "p50 / in-process"]  # fmt: skip
    return markdown_table(headers, rows, ["r", "l", "r", "r", "r"]) + [
        "",
        "*Before:* " + caption(h, before),
        "",
        "*After:* " + caption(h, after),
    ]


def render_serving_latency_quick(h):
    """The --quick runs of issue 27 on a loaded machine: ratios to in-process and shares of embed, one row each."""
    runs = select(h, kind="quick_ratios") + select(h, kind="quick_packed")
    rows = []
    for run in runs:
        for r in run["rows"]:
            rows.append(
                [
                    when(run)
                    + (f" {run['date_note']}" if re.fullmatch(r"\d\d:\d\d", run.get("date_note") or "") else ""),
                    run.get("label", DASH),
                    TRANSPORTS.get(r["transport"], r["transport"]),
                    str(r["clients"]),
                    times(r.get("sentences_over_in_process")),
                    times(r.get("p50_over_in_process")),
                    pct(r.get("of_embed")),
                ]
            )
    headers = ["date", "run", "transport", "clients", "sent/s / in-process", "p50 / in-process", "tok/s of embed"]
    return markdown_table(headers, rows, ["l", "l", "l", "r", "r", "r", "r"]) + ["", caption_runs(h, runs)]


def render_serving_metrics(h):
    """The metrics-cost check (issue 40): gRPC at 32 clients with the Prometheus metrics on and off."""
    run = latest(h, kind="metrics")
    rows = [[TRANSPORTS.get(r["transport"], r["transport"]), str(r["clients"]), fmt(r["sentences_per_s"], ".1f")]
            for r in run["rows"]]  # fmt: skip
    rows.append(["on / off", "32", times(run["metrics_ratio"], ".3f")])
    for s in run.get("shorter_runs", []):
        rows.append([f"on / off, {s['rounds']} rounds of {s['requests']} requests", "32", times(s["ratio"])])
    rows.append(["recording one request (timeit)", DASH, f"{run['per_request_recording_us']} us"])
    rows.append(["one scrape (timeit)", DASH, f"{run['scrape_ms']} ms"])
    return markdown_table(["transport or measure", "clients", "sentences/s"], rows) + ["", caption(h, run)]


def render_train_throughput(h, kind="vs_97bf9b2"):
    """The latest side-by-side training run of `kind` against 97bf9b2: targets/s, speed-up, share of the roofline."""
    run = latest(h, kind=kind)
    rows = []
    for r in run["rows"]:
        per_round = ", ".join(
            f"{fmt(x['baseline'], ',.0f')} / {fmt(x['ours'], ',.0f')} ({times(x['speedup'])})"
            for x in r.get("rounds", [])
        )
        rows.append(
            [
                r["config"],
                fmt(r["params"]),
                fmt(r["num_sampled"], ","),
                fmt(r["ours_targets_per_s"], ",.0f"),
                fmt(r["baseline_targets_per_s"], ",.0f"),
                f"**{times(r['speedup'])}**",
                pair(r["ours_fraction_of_roofline"], r["baseline_fraction_of_roofline"], ".0%")
                if kind != "vs_97bf9b2_bf16"
                else f"{pct(r['ours_fraction_of_roofline'])} / {pct(r.get('ours_fraction_of_low_precision_roofline'))}"
                f" (97bf9b2 {pct(r['baseline_fraction_of_roofline'])})",
                pair(r["ours_peak_rss_mb"], r["baseline_peak_rss_mb"]),
                per_round or DASH,
            ]
        )
    base = run.get("baseline") or "97bf9b2"
    fraction = (
        "% of float32 / bfloat16 roofline (97bf9b2 float32)"
        if kind == "vs_97bf9b2_bf16"
        else f"% roofline ours / {base}"
    )
    headers = ["config", "params", "sampled", "ours targets/s", f"{base} targets/s", "speed-up", fraction,
               f"peak RSS MB ours / {base}", f"per round ({base} / ours)"]  # fmt: skip
    return markdown_table(headers, rows, ["l"] + ["r"] * 7 + ["l"]) + ["", caption(h, run)]


def render_train_throughput_history(h):
    """Every side-by-side run against 97bf9b2 (float32 and bfloat16), one row per run: the speed-up per config."""
    runs = select(h, kind="vs_97bf9b2") + select(h, kind="vs_97bf9b2_bf16")
    runs.sort(key=lambda r: h["runs"].index(r))
    rows = []
    for run in runs:
        cells = {r["config"]: r for r in run["rows"]}
        row = [when(run), fmt(run.get("session")), fmt(run.get("commit")), str(run.get("rounds", DASH)), roof(run)]
        for config in ("ptb5m", "original"):
            r = cells.get(config)
            if r is None:
                row.append(DASH)
                continue
            text = times(r["speedup"])
            if r["ours_targets_per_s"] is not None:
                text += f" ({fmt(r['ours_targets_per_s'], ',.0f')} / {fmt(r['baseline_targets_per_s'], ',.0f')})"
            if r.get("speedup_per_round") and not r.get("rounds"):
                text += "; rounds " + ", ".join(f"{x:.2f}" for x in r["speedup_per_round"])
            row.append(text)
        what = run.get("change") or ""
        if run.get("matmul_precision") == "bfloat16":
            what = (what + "; " if what else "") + "bfloat16 matmuls"
        row.append(what or DASH)
        rows.append(row)
    headers = ["date", "session", "commit", "rounds", "roofline", "ptb5m (ours / 97bf9b2 targets/s)",
               "original (ours / 97bf9b2 targets/s)", "what changed"]  # fmt: skip
    return markdown_table(headers, rows, ["l", "r", "l", "r", "r", "r", "r", "l"]) + ["", caption_runs(h, runs)]


def render_train_throughput_ab(h):
    """Single changes measured against the commit before them (`--baseline REV`): the ratio per config and round."""
    runs = select(h, kind="ab") + select(h, kind="bf16_vs_fp32")
    runs.sort(key=lambda r: h["runs"].index(r))
    rows = []
    for run in runs:
        change = run.get("change") or ("bfloat16 against float32 matmuls" if run["kind"] == "bf16_vs_fp32" else DASH)
        for r in run["rows"]:
            rounds = r.get("speedup_per_round") or [x["speedup"] for x in r.get("rounds", [])]
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    change,
                    fmt(run.get("baseline")),
                    fmt(r["config"], none="not named"),
                    times(r["speedup"]),
                    ", ".join(f"{x:.2f}x" for x in rounds) or DASH,
                ]
            )
    headers = ["date", "commit", "change", "against", "config", "speed-up", "per round"]
    return markdown_table(headers, rows, ["l", "l", "l", "l", "l", "r", "r"]) + ["", caption_runs(h, runs)]


def render_train_throughput_profile(h):
    """The parts of one training step (the latest run with a profile): ms, GFLOP/s and share of the roofline."""
    run = [r for r in h["runs"] if r.get("profile") and r.get("kind") == "vs_97bf9b2"][-1]
    profile = run["profile"]
    configs = profile.get("configs", ["ptb5m", "original"])
    rows = []
    for p in profile["rows"]:
        row = [p["part"]]
        for c in configs:
            ms, gflops, frac = p.get(f"{c}_ms"), p.get(f"{c}_gflops"), p.get(f"{c}_fraction_of_roofline")
            row.append(fmt(ms, ",.0f") + ("" if gflops is None else f" ({gflops:.0f}, {pct(frac)})"))
        rows.append(row)
    headers = ["part"] + [f"{c} ms (GFLOP/s, % of roofline)" for c in configs]
    return markdown_table(headers, rows) + ["", f"*Batch: {escape(profile['batch'])}.* " + caption(h, run)]


def render_pretrain_ptb(h):
    """Every PTB pretraining run beside the published anchors: steps, training time, speed, perplexities."""
    rows = []
    for run in h["runs"]:
        for r in run["rows"]:
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    fmt(run.get("session")),
                    run.get("label", DASH),
                    fmt(r["params"]),
                    fmt(r["steps"], ","),
                    fmt(r["epochs"], "g"),
                    fmt(r["training_minutes"], "g"),
                    fmt(r["targets_per_s"], ",.0f"),
                    " / ".join(fmt(r[k], ".1f") for k in ("valid_fwd", "valid_bwd", "valid_avg")),
                    " / ".join(fmt(r[k], ".1f") for k in ("test_fwd", "test_bwd", "test_avg")),
                ]
            )
    for ref in h.get("references", []):
        rows.append(
            [
                DASH,
                DASH,
                DASH,
                ref["model"],
                ref["params"],
                DASH,
                str(ref["epochs"]),
                DASH,
                DASH,
                fmt(ref["valid"], ".1f"),
                fmt(ref["test"], ".1f"),
            ]  # fmt: skip
        )
    headers = ["date", "commit", "session", "run", "params", "steps", "epochs", "training min", "targets/s",
               "valid fwd / bwd / avg", "test fwd / bwd / avg"]  # fmt: skip
    runs = h["runs"]
    return markdown_table(headers, rows, ["l", "l", "r", "l"] + ["r"] * 7) + ["", caption_runs(h, runs)]


def render_pretrain_ptb_curve(h):
    """The training perplexity against minutes of the latest run that logged a curve."""
    run = [r for r in h["runs"] if r.get("curve")][-1]
    points = run["curve"]["rows"]
    r = run["rows"][0]
    headers = ["minutes"] + [str(p["minutes"]) for p in points] + ["end: valid / test (full softmax)"]
    rows = [
        ["epochs"] + [fmt(p["epochs"], "g") for p in points] + [fmt(r["epochs"], ".1f")],
        ["train perplexity"] + [fmt(p["train_perplexity"], "g") for p in points]
        + [f"{fmt(r['valid_avg'], '.1f')} / {fmt(r['test_avg'], '.1f')}"],
    ]  # fmt: skip
    return markdown_table(headers, rows) + ["", caption(h, run)]


def _ner_cells(run):
    return {(r["dataset"], r["variant"]): r for r in run["rows"]}


def _f1(r, key):
    if r is None or r.get(key) is None:
        return DASH
    std = r.get(f"{key}_std")
    return f"{r[key]:.2f}" + ("" if std is None else f" ± {std:.2f}")


def render_ner_quality(h):
    """The latest NER run, per dataset: F1 without and with ELMo (dev / test), the gain, the paper's."""
    run = latest(h, commit=[r for r in h["runs"] if r.get("commit")][-1]["commit"])
    cells = _ner_cells(run)
    gains = {g["dataset"]: g for g in run.get("gains", [])}
    paper = h.get("paper", {})
    rows = []
    for dataset in dict.fromkeys(r["dataset"] for r in run["rows"]):
        no, yes = cells.get((dataset, "no ELMo")), cells.get((dataset, "ELMo"))
        gain = gains.get(dataset, {}).get("test_gain")
        p = paper.get(dataset)
        rows.append(
            [
                dataset,
                f"{_f1(no, 'dev_f1')} / {_f1(no, 'test_f1')}",
                f"{_f1(yes, 'dev_f1')} / {_f1(yes, 'test_f1')}",
                DASH if gain is None else f"{gain:+.2f}",
                DASH if not p else f"{p['test_without']:.2f} -> {p['test_with']:.2f} ({p['gain']:+.2f})",
            ]
        )
    headers = ["dataset", "without ELMo dev / test", "with ELMo dev / test", "ELMo gain (test)", "paper (test)"]
    return markdown_table(headers, rows) + ["", caption(h, run)]


def render_ner_quality_runs(h):
    """The latest NER run in full: each variant's dev and test F1 (mean ± std over seeds), best epochs, minutes."""
    run = [r for r in h["runs"] if r.get("commit")][-1]
    rows = [
        [
            r["dataset"],
            r["variant"],
            _f1(r, "dev_f1"),
            _f1(r, "test_f1"),
            ", ".join(str(e) for e in r["best_epochs"] or []) or DASH,
            fmt(r["minutes_per_run"], ".1f") + (f" ({r['minutes_note']})" if r.get("minutes_note") else ""),
        ]
        for r in run["rows"]
    ]
    for g in run.get("gains", []):
        at = max(k for k, row in enumerate(rows) if row[0] == g["dataset"]) + 1
        rows.insert(
            at, [g["dataset"], "**gain**", fmt(g["dev_gain"], "+.2f"), f"**{fmt(g['test_gain'], '+.2f')}**", "", ""]
        )
    headers = ["dataset", "variant", "dev F1 mean ± std", "test F1 mean ± std", "best epochs", "min/run"]
    return markdown_table(headers, rows, ["l", "l", "r", "r", "l", "r"]) + ["", caption(h, run)]


def render_ner_quality_history(h):
    """Every NER run: test F1 without and with ELMo per dataset, and the biLM behind it."""
    rows = []
    for run in h["runs"]:
        cells = _ner_cells(run)
        gains = {g["dataset"]: g for g in run.get("gains", [])}
        bilm = run.get("bilm")
        if isinstance(bilm, dict):
            bilm = f"{bilm['minutes']}-minute {bilm['optimizer']} biLM, {bilm['epochs']} epochs (at {bilm['commit']})"
        for dataset in dict.fromkeys(r["dataset"] for r in run["rows"]):
            no, yes = cells[(dataset, "no ELMo")], cells[(dataset, "ELMo")]
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    bilm or DASH,
                    dataset,
                    f"{no['test_f1']:.2f} -> {yes['test_f1']:.2f}",
                    fmt(gains.get(dataset, {}).get("test_gain"), "+.2f"),
                ]
            )
    headers = ["date", "commit", "biLM", "dataset", "test F1 without -> with ELMo", "gain"]
    return markdown_table(headers, rows, ["l", "l", "l", "l", "r", "r"]) + ["", caption_runs(h, h["runs"])]


def render_ner_quality_per_type(h):
    """The latest NER run's test F1 per entity type (mean of the seeds), without and with ELMo."""
    run = [r for r in h["runs"] if r.get("per_type_test_f1")][-1]
    rows = [[t["dataset"], t["type"], f"{t['no_elmo']:.1f}", f"{t['elmo']:.1f}"] for t in run["per_type_test_f1"]]
    return markdown_table(["dataset", "type", "no ELMo", "ELMo"], rows, ["l", "l", "r", "r"]) + ["", caption(h, run)]


def render_lm_score(h):
    """Every language-model scoring run: sentences/s of score and of embed on the same sentences."""
    rows = []
    for run in h["runs"]:
        for r in run["rows"]:
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    f"{run.get('label', DASH)} ({r['preset']}, {r['softmax']})",
                    f"{r['sentences']} ({r['tokens']:,} tokens)",
                    fmt(r["embed_sentences_per_s"], ".1f"),
                    fmt(r["score_sentences_per_s"], ".1f"),
                    fmt(r.get("softmax_gflops"), "g"),
                    fmt(r.get("peak_rss_mib"), ",.0f"),
                ]
            )
    headers = ["date", "commit", "run", "sentences", "embed sentences/s", "score sentences/s",
               "softmax GFLOP/s", "peak RSS MiB"]  # fmt: skip
    return markdown_table(headers, rows, ["l", "l", "l", "r", "r", "r", "r", "r"]) + ["", caption_runs(h, h["runs"])]


def render_peer_parity(h):
    """Every parity run against AllenNLP: max |ours - peer| per layer and weight set."""
    rows = []
    for run in h["runs"]:
        if not run["rows"]:
            rows.append([when(run), fmt(run.get("commit")), f"all ({run.get('result', DASH)})", DASH, DASH, DASH,
                         "as the run before"])  # fmt: skip
        for r in run["rows"]:
            if r["status"] != "compared":
                rows.append([when(run), fmt(run.get("commit")), r["weights"], r["status"], "", "", ""])
                continue
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    r["weights"],
                    sci(r["layer0_max_abs_diff"]),
                    sci(r["layer1_max_abs_diff"]),
                    sci(r["layer2_max_abs_diff"]),
                    sci(r["max_abs_diff"]),
                ]
            )
    headers = ["date", "commit", "weights", "layer 0", "layer 1", "layer 2", "max"]
    lines = markdown_table(headers, rows, ["l", "l", "l", "r", "r", "r", "r"])
    return lines + ["", f"*Max \\|ours - AllenNLP\\|; tolerance {h['tolerance']:g}.* " + caption_runs(h, h["runs"])]


def measured(h, measure):
    """`(pairs, runs)`: `(run, row)` for every row of the history `h` that measured `measure`, oldest first, and the
    runs those rows come from, each once (for the caption)."""
    pairs = [(run, r) for run in h["runs"] for r in run["rows"] if r["measure"] == measure]
    return pairs, list({id(run): run for run, _ in pairs}.values())


def render_embed_resume(h):
    """Every --resume measurement: a run killed half-way and resumed, against an uninterrupted one."""
    pairs, runs = measured(h, "resume")
    rows = [
        [
            when(run),
            fmt(r.get("commit") or run.get("commit")),
            f"{r['lines']:,}",
            f"**{r['ratio']:.2f}**" if r is run["rows"][0] else f"{r['ratio']:.2f}",
            pair(r["resumed_s"], r["uninterrupted_s"], ".1f"),
            fmt(r["startup_s"], ".1f"),
            "yes" if r["identical"] else "no",
        ]
        for run, r in pairs
    ]
    target = h["targets"]["resume_ratio_max"]
    headers = ["date", "commit", "lines", f"resumed / uninterrupted (target <= {target})", "seconds",
               "start-up s", "bitwise identical"]  # fmt: skip
    return markdown_table(headers, rows, ["l", "l"] + ["r"] * 5) + ["", caption_runs(h, runs)]


def render_embed_resume_float16(h):
    """float16 output: file size against float32, and the rounding error of each recorded run."""
    rows, runs = [], []
    for run in h["runs"]:
        for r in run["rows"]:
            if r["measure"] == "float16_size":
                what = f"float16 / float32 file size, {r['lines']:,} lines" + (
                    f", width {r['width']}" if r.get("width") else ""
                )
                value = raw(r["ratio"])
                if r.get("float16_mb"):
                    value += f" ({r['float16_mb']:,} / {r['float32_mb']:,} MB)"
            elif r["measure"] == "rounding_error":
                what = f"error: {r['what']}"
                value = " / ".join(sci(r[k]) for k in ("max_abs", "mean_abs", "max_rel"))
            else:
                continue
            runs.append(run)
            rows.append([when(run), fmt(run.get("commit")), what, value])
    headers = ["date", "commit", "measure", "value (errors: max abs / mean abs / max rel)"]
    runs = list({id(r): r for r in runs}.values())
    target = h["targets"]["float16_size_ratio_max"]
    return markdown_table(headers, rows, ["l", "l", "l", "r"]) + [
        "",
        f"*Target: float16 / float32 size <= {target}.* " + caption_runs(h, runs),
    ]


def render_embed_resume_rss(h):
    """Peak RSS of embed over 100,000 lines against 1,000 lines (the memory stays flat with the corpus)."""
    pairs, runs = measured(h, "peak_rss")
    rows = [
        [
            when(run),
            fmt(r.get("commit") or run.get("commit")),
            r.get("variant") or DASH,
            raw(r["ratio"]),
            pair(r["rss_large_mib"], r["rss_small_mib"]),
        ]
        for run, r in pairs
    ]
    target = h["targets"]["rss_ratio_max"]
    headers = ["date", "commit", "variant", f"100,000 / 1,000 lines (target <= {target:.2f})", "peak RSS MiB"]
    return markdown_table(headers, rows, ["l", "l", "l", "r", "r"]) + ["", caption_runs(h, runs)]


def render_beam_throughput(h):
    """Every Beam run: DirectRunner tokens/s against embed's on the same file, end to end and marginal."""
    rows = []
    for run in h["runs"]:
        for r in run["rows"]:
            lines = r["lines"] if isinstance(r["lines"], str) else f"{r['lines']:,}"
            rows.append(
                [
                    when(run),
                    fmt(run.get("commit")),
                    lines,
                    f"{r['ratio']:.2f}",
                    pair(r["beam_tokens_per_s"], r["embed_tokens_per_s"]),
                    sci(run.get("merged_max_abs_diff")) if r is run["rows"][0] else "",
                ]
            )
    headers = ["date", "commit", "lines", f"Beam / embed (target >= {h['targets']['ratio_min']})",
               "tokens/s Beam / embed", "merged shards: max abs diff"]  # fmt: skip
    setup = h["setup"]
    return markdown_table(headers, rows, ["l", "l", "r", "r", "r", "r"]) + [
        "",
        f"*Beam: {setup['beam']}; embed: {setup['embed']}; {setup['preset']} shapes, batch {setup['batch']}; "
        f"marginal: start-up excluded.* " + caption_runs(h, h["runs"]),
    ]


def render_durations(histories):
    """How long one run of each benchmark takes, from every history file's `durations`."""
    rows = []
    for h in histories:
        for d in h.get("durations", []):
            rows.append([f"`{d['mode']}`", d["one_run"], d.get("from") or DASH])
    lines = markdown_table(["script, mode", "one run", "from"], rows, ["l", "l", "l"])
    return lines + [
        "",
        "*From the `durations` of `bench/results/history/*.json`; 2 cores; estimates are marked. Run each benchmark "
        "alone, never beside the tests.*",
    ]


TABLES = {
    "embed_throughput": ("embed_throughput", render_embed_throughput),
    "embed_throughput_full": ("embed_throughput", render_embed_throughput_full),
    "embed_throughput_history": ("embed_throughput", render_embed_throughput_history),
    "serving_latency": ("serving_latency", render_serving_latency),
    "serving_latency_grid": ("serving_latency", render_serving_latency_grid),
    "serving_latency_issue12": ("serving_latency", render_serving_latency_issue12),
    "serving_latency_quick": ("serving_latency", render_serving_latency_quick),
    "serving_metrics": ("serving_latency", render_serving_metrics),
    "train_throughput": ("train_throughput", render_train_throughput),
    "train_throughput_bf16": ("train_throughput", lambda h: render_train_throughput(h, "vs_97bf9b2_bf16")),
    "train_throughput_history": ("train_throughput", render_train_throughput_history),
    "train_throughput_ab": ("train_throughput", render_train_throughput_ab),
    "train_throughput_profile": ("train_throughput", render_train_throughput_profile),
    "pretrain_ptb": ("pretrain_ptb", render_pretrain_ptb),
    "pretrain_ptb_curve": ("pretrain_ptb", render_pretrain_ptb_curve),
    "ner_quality": ("ner_quality", render_ner_quality),
    "ner_quality_runs": ("ner_quality", render_ner_quality_runs),
    "ner_quality_history": ("ner_quality", render_ner_quality_history),
    "ner_quality_per_type": ("ner_quality", render_ner_quality_per_type),
    "lm_score": ("lm_score", render_lm_score),
    "peer_parity": ("peer_parity", render_peer_parity),
    "embed_resume": ("embed_resume", render_embed_resume),
    "embed_resume_float16": ("embed_resume", render_embed_resume_float16),
    "embed_resume_rss": ("embed_resume", render_embed_resume_rss),
    "beam_throughput": ("beam_throughput", render_beam_throughput),
    "durations": (None, render_durations),
    "embed_backends": ("embed_throughput", render_embed_backends),
}
for _name in (
    "embed_throughput",
    "serving_latency",
    "train_throughput",
    "pretrain_ptb",
    "ner_quality",
    "lm_score",
    "peer_parity",
    "embed_resume",
    "beam_throughput",
):
    TABLES[f"{_name}_durations"] = (_name, lambda h: render_durations([h]))


# ------------------------------------------------------------------------------------------------ history files


def load_history(name, history_dir=HISTORY):
    """The parsed history of benchmark `name` from `history_dir`; ValueError naming the file when it is missing,
    does not parse, or names another benchmark."""
    path = os.path.join(history_dir, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            history = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"history {name!r}: no file {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"history {name!r}: {path} does not parse: {e}") from None
    if history.get("benchmark") != name:
        raise ValueError(f"history {name!r}: {path} names benchmark {history.get('benchmark')!r}")
    return history


def history_names(history_dir=HISTORY):
    """The benchmarks with a history file in `history_dir`, sorted."""
    return sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(history_dir, "*.json")))


def render(table_id, history_dir=HISTORY):
    """The Markdown of table `table_id` (no trailing newline); ValueError naming the ID when it is unknown."""
    if table_id not in TABLES:
        raise ValueError(f"table ID {table_id!r}: unknown (known: {', '.join(sorted(TABLES))})")
    name, fn = TABLES[table_id]
    if name is None:
        lines = fn([load_history(n, history_dir) for n in history_names(history_dir)])
    else:
        lines = fn(load_history(name, history_dir))
    return "\n".join(lines)


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


# ------------------------------------------------------------------------------------------------ record


def short_commit(commit=None, repo=REPO):
    """`commit` (HEAD when None) as git's short hash, or `commit` cut to 7 characters when git cannot say (None
    when both are missing)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", commit or "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return commit[:7] if commit else None


def run_header(result, source="bench/tables.py record"):
    """The provenance fields of a RUN recorded from a bench script's `result` JSON: date (the result's, else today),
    commit (the result's, else HEAD), CPU (the result's, else this machine's), roofline (the result's or None)."""
    commit = result.get("git_commit") or result.get("commit")
    date = result.get("date") or (result.get("time") or "")[:10] or datetime.date.today().isoformat()
    return {
        "date": date,
        "commit": short_commit(commit),
        "cpu": result.get("cpu") or cpu_description(),
        "roofline_gflops": result.get("roofline_gflops"),
        "session": None,
        "source": source,
    }


def adapt_embed_throughput(result):
    """A RUN of embed_throughput from bench/embed_throughput.py's --out JSON."""
    run = run_header(result)
    rows = []
    for r in result["runs"]:
        ours, peer = r["ours"], r.get("peer") or {}
        row = {
            "batch_size": r["batch_size"],
            "order": r["order"],
            "variant": r.get("variant"),
            "ours_tokens_per_s": ours["tokens_per_s"],
            "peer_tokens_per_s": peer.get("tokens_per_s"),
            "ratio": r.get("ratio"),
            "ours_gflops": ours.get("gflops"),
            "fraction_of_roofline": ours.get("fraction_of_roofline"),
            "ours_peak_rss_mib": ours.get("peak_rss_mib"),
            "peer_peak_rss_mib": peer.get("peak_rss_mib"),
            "row_fill": ours.get("position_fill"),
            "speedup_vs_default": r.get("speedup_vs_default"),
        }
        if r.get("ratio_vs_embedder") is not None:  # a --backend row: ELMo itself on that Keras backend
            row["ratio_vs_embedder"] = r["ratio_vs_embedder"]
        if r.get("repeat"):
            row["repeat"] = r["repeat"]
        rows.append(row)
    plain = [r for r in result["runs"] if not r.get("variant")]
    if result.get("quick"):
        scope = "quick"
    elif any(r.get("ratio_vs_embedder") is not None for r in result["runs"]):
        scope = "backends"
    else:
        scope = "full" if plain and all(r.get("peer") for r in plain) else "partial"
    matmul = result.get("matmul") or []
    sizes = {}
    for m in matmul:
        for n, v in (m.get("sizes") or {}).items():
            sizes.setdefault(str(n), []).append(round(v["best_gflops"], 1))
    run.update(
        scope=scope,
        matmul_gflops=sizes or None,
        n_sentences=result.get("n_sentences"),
        n_tokens=result.get("n_tokens"),
        targets_missed=(result.get("targets") or {}).get("missed"),
        rows=rows,
    )
    return run


def adapt_serving_latency(result):
    """A RUN of serving_latency from bench/serving_latency.py's --out JSON."""
    run = run_header(result)
    ratios = {(x["preset"], x["transport"], x["concurrency"]): x for x in result.get("overheads", [])}
    rows = []
    for r in result["rows"]:
        x = ratios.get((r["preset"], r["transport"], r["concurrency"]), {})
        rows.append(
            {
                "preset": r["preset"],
                "transport": r["transport"],
                "clients": None if r["transport"] == "embed" else r["concurrency"],
                "p50_ms": r.get("p50_ms"),
                "sentences_per_s": r.get("sentences_per_s"),
                "p99_ms": r.get("p99_ms"),
                "tokens_per_s": r.get("tokens_per_s"),
                "of_embed": 1.0 if r["transport"] == "embed" else x.get("of_embed"),
                "p50_over_in_process": x.get("p50_ratio"),
                "sentences_over_in_process": x.get("throughput_ratio"),
                "errors": r.get("errors"),
            }
        )
    run.update(
        kind="quick_recorded" if result.get("quick") else "full",
        duration=f"{result['duration_s'] / 60:.0f} min" if result.get("duration_s") else None,
        settings=result.get("settings"),
        targets=result.get("targets"),
        rows=rows,
    )
    return run


def adapt_train_throughput(result):
    """A RUN of train_throughput from bench/train_throughput.py's --out JSON."""
    run = run_header(result)
    baseline = result.get("baseline") or {}
    rev = baseline.get("rev") or ""
    precision = result.get("matmul_precision", "float32")
    low = result.get("low_precision_roofline_gflops")
    if rev.startswith("97bf9b2"):
        kind = "vs_97bf9b2" if precision == "float32" else "vs_97bf9b2_bf16"
    elif rev.upper() == "HEAD" and precision != "float32":
        kind = "bf16_vs_fp32"
    else:
        kind = "ab"
    rows, profile_rows, configs, batch = [], [], [], None
    for r in result["results"]:
        ours, base = r.get("ours") or {}, r.get("baseline") or {}
        pairs = list(zip(r["rounds"].get("baseline", []), r["rounds"].get("ours", [])))
        params = ours.get("params")
        row = {
            "config": r["config"],
            "params": f"{params / 1e6:.2f}M" if isinstance(params, (int, float)) else params,
            "num_sampled": ours.get("num_sampled"),
            "ours_targets_per_s": ours.get("targets_per_s"),
            "baseline_targets_per_s": base.get("targets_per_s"),
            "speedup": r.get("speedup"),
            "ours_gflops": ours.get("gflops"),
            "ours_fraction_of_roofline": ours.get("fraction_of_roofline"),
            "baseline_fraction_of_roofline": base.get("fraction_of_roofline"),
            "ours_peak_rss_mb": ours.get("peak_rss_mb"),
            "baseline_peak_rss_mb": base.get("peak_rss_mb"),
            "replicas": r.get("replicas"),
            "rounds": [
                {
                    "baseline": b.get("targets_per_s"),
                    "ours": o.get("targets_per_s"),
                    "speedup": o["targets_per_s"] / b["targets_per_s"]
                    if b.get("targets_per_s") and o.get("targets_per_s")
                    else None,
                }
                for b, o in pairs
            ],
        }
        if low and ours.get("gflops") is not None:
            row["ours_fraction_of_low_precision_roofline"] = ours["gflops"] / low
        rows.append(row)
        prof = r.get("parts")
        if prof:
            configs.append(r["config"])
            batch = batch or f"{prof['rows']} sentences x {prof['length']} tokens"
            for k, part in enumerate(prof["parts"]):
                if k == len(profile_rows):
                    profile_rows.append({"part": part["part"]})
                gflops = part.get("gflops")
                profile_rows[k][f"{r['config']}_ms"] = part["ms"]
                profile_rows[k][f"{r['config']}_gflops"] = gflops
                profile_rows[k][f"{r['config']}_fraction_of_roofline"] = (
                    gflops / run["roofline_gflops"] if gflops is not None and run["roofline_gflops"] else None
                )
    run.update(
        kind=kind,
        baseline=rev or None,
        rounds=(result.get("settings") or {}).get("rounds"),
        matmul_precision=precision,
        low_precision_roofline_gflops=low,
        rows=rows,
    )
    if profile_rows:
        run["profile"] = {"batch": batch, "configs": configs, "rows": profile_rows}
    return run


ADAPTERS = {
    "embed_throughput": adapt_embed_throughput,
    "serving_latency": adapt_serving_latency,
    "train_throughput": adapt_train_throughput,
}


def record(name, result_path, history_dir=HISTORY, command=None, note=None):
    """Appends the run in `result_path` (the --out JSON of bench/NAME.py) to `name`'s history; returns the RUN.
    ValueError naming the benchmark when it has no adapter or no history, or naming the file when it does not
    parse."""
    if name not in ADAPTERS:
        raise ValueError(
            f"record {name!r}: no adapter for this benchmark yet (adapters: {', '.join(sorted(ADAPTERS))}); add its "
            f"run to bench/results/history/{name}.json by hand"
        )
    history = load_history(name, history_dir)
    try:
        with open(result_path, encoding="utf-8") as f:
            result = json.load(f)
    except OSError as e:
        raise ValueError(f"RESULT {result_path!r}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"RESULT {result_path!r}: does not parse: {e}") from None
    try:
        run = ADAPTERS[name](result)
    except (KeyError, TypeError) as e:
        raise ValueError(f"RESULT {result_path!r}: not the output of bench/{name}.py (missing {e})") from None
    run["command"] = command or history["command"]
    if note:
        run["note"] = note
    history["runs"].append(run)
    save_history(history, history_dir)
    return run


def save_history(history, history_dir=HISTORY):
    """Writes `history` to its file in `history_dir` (indented JSON, atomically: `elmo_tf.io.atomic.write_json`)."""
    write_json(os.path.join(history_dir, f"{history['benchmark']}.json"), history, ensure_ascii=False)


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
