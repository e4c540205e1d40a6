"""The speed tables of the embedder, the server and training (embed_throughput, serving_latency, train_throughput) as
data: `SPEED_TABLES` maps a table ID to a `Table` (bench/table_render.py). The standard library only."""

import re

from table_render import (
    COMMIT,
    DASH,
    DATE,
    Column,
    Table,
    each_row,
    escape,
    fmt,
    newest,
    newest_with,
    number,
    of_kinds,
    pair,
    pct,
    raw,
    roof,
    text,
    the_run,
    times,
    when,
)

# ------------------------------------------------------------------------------------------------ embed_throughput


def order_text(row):
    """An embed_throughput row's "batch, order" cell ("64, length-sorted", "64, sorted, +cache")."""
    if row.get("summary"):
        return "all"
    order = {"sorted": "length-sorted", "corpus": "corpus order"}.get(row["order"], row["order"])
    if row.get("variant"):
        return f"{row['batch_size']}, {row['order']}, {row['variant']}"
    return f"{row['batch_size']}, {order}"


def backend_path(variant):
    """The "backend, path" cell of a backend row's `variant` ("jax", "jax bfloat16", "jax embedder"; None: the
    Embedder on TensorFlow)."""
    if not variant:
        return "TensorFlow, the Embedder"
    backend, _, rest = variant.partition(" ")
    if rest.startswith("embedder"):
        return f"{backend}{rest[len('embedder') :]}, the Embedder"
    return f"{variant}, ELMo itself"


def gflops_cell(run, r):
    return f"{fmt(r['ours_gflops'], '.0f')} ({pct(r['fraction_of_roofline'])})"


def ranged(r, key):
    """A ratio with its range over the run's rounds where recorded ("2.61x (2.48-2.70x)"), else the ratio alone."""
    low_high = r.get(f"{key}_range")
    if not low_high or r.get("rounds", 1) < 2:
        return times(r.get(key))
    return f"{times(r[key])} ({low_high[0]:.2f}-{times(low_high[1])})"


def vs_float32(run, r):
    """A row's tokens/s over the float32 Embedder row of the same batch and order in its run (1.0 for that row)."""
    for other in run["rows"]:
        same = (other["batch_size"], other["order"]) == (r["batch_size"], r["order"])
        if same and not other.get("variant") and other.get("precision", "float32") == "float32":
            return r["ours_tokens_per_s"] / other["ours_tokens_per_s"]
    return None


def rss_cell(run, r):
    if r.get("peer_peak_rss_mib"):
        return pair(r["ours_peak_rss_mib"], r["peer_peak_rss_mib"])
    return fmt(r.get("ours_peak_rss_mib"), ",.0f")


def matmul_suffix(h, runs, pairs):
    """The one run's caption, with the matmul GFLOP/s before and after the run where recorded."""
    (line,) = the_run()(h, runs, pairs)
    matmul = runs[-1].get("matmul_gflops")
    if matmul:
        sizes = "; ".join(f"{n}^3 {'/'.join(fmt(v, '.0f') for v in vals)}" for n, vals in matmul.items())
        line = line[:-1] + f" Matmul GFLOP/s before/after the run: {sizes}.*"
    return [line]


def summary_range(run, low, high, cell):
    summary = run.get("summary") or {}
    return f"{cell(summary.get(low))}-{cell(summary.get(high))}"


def history_roofline(run, r):
    return roof(run) if r.get("summary") or run.get("roofline_gflops") else run.get("roofline_note", DASH)


def history_ratio(run, r):
    if r.get("summary"):
        return summary_range(run, "ratio_min", "ratio_max", times)
    if r["ratio"] is not None:
        return times(r["ratio"])
    return times(r.get("speedup_vs_default")) + (" the default" if r.get("speedup_vs_default") else "")


def history_fraction(run, r):
    summary = run.get("summary") or {}
    if r.get("summary") or (
        r["fraction_of_roofline"] is None and "fraction_of_roofline_min" in summary and not r.get("variant")
    ):
        return summary_range(run, "fraction_of_roofline_min", "fraction_of_roofline_max", pct)
    return pct(r["fraction_of_roofline"])


def rows_or_summary(h, runs):
    """Each run's rows; a run that recorded only ranges (no rows) as one summary row."""
    return [(run, r) for run in runs for r in (run["rows"] or [{"summary": True}])]


EMBED_ORDER = Column("batch, order", lambda run, r: order_text(r), "l")
EMBED_TOKENS = (number("elmo_tf tok/s", "ours_tokens_per_s"), number("AllenNLP tok/s", "peer_tokens_per_s"))
EMBED_TABLES = {
    "embed_throughput": Table(
        "embed_throughput",
        [
            EMBED_ORDER,
            *EMBED_TOKENS,
            Column("ratio", lambda run, r: times(r["ratio"])),
            Column("elmo_tf GFLOP/s (% of roofline)", gflops_cell),
            Column(
                "peak RSS MiB, ours / AllenNLP", lambda run, r: pair(r["ours_peak_rss_mib"], r["peer_peak_rss_mib"])
            ),
        ],
        runs=newest(scope="full"),
        rows=lambda h, runs: [(run, r) for run, r in each_row(h, runs) if not r.get("variant")],
        caption=the_run(),
    ),
    "embed_throughput_full": Table(
        "embed_throughput",
        [
            EMBED_ORDER,
            *EMBED_TOKENS,
            Column("ratio", lambda run, r: times(r["ratio"])),
            Column(
                "elmo_tf GFLOP/s (% of roofline)",
                lambda run, r: (
                    f"({times(r['speedup_vs_default'])} the default)"
                    if r.get("speedup_vs_default") is not None and r.get("ours_gflops") is None
                    else gflops_cell(run, r)
                ),
            ),
            Column("RSS MiB ours / AllenNLP", rss_cell),
            Column("row fill", lambda run, r: pct(r["row_fill"])),
        ],
        runs=newest(scope="full"),
        caption=matmul_suffix,
    ),
    "embed_backends": Table(
        "embed_throughput",
        [
            Column("batch, order", lambda run, r: f"{r['batch_size']}, {r['order']}", "l"),
            Column(
                "backend, path",
                lambda run, r: backend_path(r.get("variant")),
            ),
            number("tok/s", "ours_tokens_per_s"),
            Column("vs AllenNLP (range over rounds)", lambda run, r: ranged(r, "ratio")),
            Column(
                "vs the Embedder (range)",
                lambda run, r: ranged(r, "ratio_vs_embedder") if r.get("variant") else "1.00x",
            ),
            Column("GFLOP/s (% of roofline)", gflops_cell),
            number("peak RSS MiB", "ours_peak_rss_mib"),
        ],
        runs=newest(scope="backends"),
        caption=the_run(),
    ),
    "embed_precision": Table(
        "embed_throughput",
        [
            Column("batch, order", lambda run, r: f"{r['batch_size']}, {r['order']}", "l"),
            Column("precision", lambda run, r: r.get("precision", "float32"), "l"),
            number("elmo_tf tok/s", "ours_tokens_per_s"),
            Column("vs float32", lambda run, r: times(vs_float32(run, r))),
            number("AllenNLP tok/s", "peer_tokens_per_s"),
            Column("vs AllenNLP", lambda run, r: times(r.get("ratio"))),
            number("peak RSS MiB", "ours_peak_rss_mib"),
        ],
        runs=newest(scope="precision"),
        caption=matmul_suffix,
    ),
    "embed_throughput_history": Table(
        "embed_throughput",
        [
            DATE,
            COMMIT,
            Column("roofline", history_roofline),
            Column("batch, order", lambda run, r: order_text(r)),
            *EMBED_TOKENS,
            Column("ratio", history_ratio),
            Column("% of roofline", history_fraction),
            Column("RSS MiB ours / AllenNLP", rss_cell),
        ],
        rows=rows_or_summary,
    ),
}


# ------------------------------------------------------------------------------------------------ serving_latency

TRANSPORTS = {
    "embed": "embed",
    "in-process": "in-process",
    "grpc": "gRPC",
    "grpc-nobatch": "gRPC, no batching",
    "grpc-nometrics": "gRPC, metrics off",
    "rest": "REST",
}
GRID_TRANSPORTS = ("in-process", "grpc", "grpc-nobatch", "rest")


def transport(run, r):
    return TRANSPORTS.get(r["transport"], r["transport"])


def latency_pair(r):
    return f"{raw(r.get('p50_ms'))} / {raw(r.get('sentences_per_s'))}"


def grid_rows(h, runs):
    """One row per (model, clients) of the run, its cells by transport."""
    (run,) = runs
    cells = {(r["preset"], r["clients"], r["transport"]): r for r in run["rows"]}
    keys = dict.fromkeys((r["preset"], r["clients"]) for r in run["rows"])
    return [
        (run, {"preset": p, "clients": c, "cells": {t: cells.get((p, c, t)) for t in GRID_TRANSPORTS}}) for p, c in keys
    ]


def model_caption(h, runs, pairs):
    """The run's caption after the model it served."""
    return [f"*Model: {runs[0]['rows'][0]['preset'] if runs[0]['rows'] else '?'}.* " + the_run()(h, runs, pairs)[0]]


def grid_cell(t):
    return lambda run, r: DASH if r["cells"][t] is None else latency_pair(r["cells"][t])


def two_quick_runs(h):
    """The last two --quick runs: a change measured before and after."""
    runs = [r for r in h["runs"] if r.get("kind") == "quick"]
    if len(runs) < 2:
        raise ValueError(f"history {h['benchmark']!r}: the before/after table needs two runs of kind 'quick'")
    return runs[-2:]


def before_after_rows(h, runs):
    before, after = runs
    index = {(r["transport"], r["clients"]): r for r in after["rows"]}
    return [(before, dict(r, after=index.get((r["transport"], r["clients"]), {}))) for r in before["rows"]]


def before_after_caption(h, runs, pairs):
    return ["*Before:* " + the_run()(h, runs[:1], pairs)[0], "", "*After:* " + the_run()(h, runs, pairs)[0]]


def quick_date(run, r):
    note = run.get("date_note") or ""
    return when(run) + (f" {note}" if re.fullmatch(r"\d\d:\d\d", note) else "")


def metrics_rows(h, runs):
    """The metrics-cost run as display rows: each transport's sentences/s, then the ratios and the timeit costs."""
    (run,) = runs
    rows = [
        {"what": transport(run, r), "clients": str(r["clients"]), "value": fmt(r["sentences_per_s"], ".1f")}
        for r in run["rows"]
    ]
    rows.append({"what": "on / off", "clients": "32", "value": times(run["metrics_ratio"], ".3f")})
    for s in run.get("shorter_runs", []):
        what = f"on / off, {s['rounds']} rounds of {s['requests']} requests"
        rows.append({"what": what, "clients": "32", "value": times(s["ratio"])})
    recording = f"{run['per_request_recording_us']} us"
    rows.append({"what": "recording one request (timeit)", "clients": DASH, "value": recording})
    rows.append({"what": "one scrape (timeit)", "clients": DASH, "value": f"{run['scrape_ms']} ms"})
    return [(run, r) for r in rows]


SERVING_TABLES = {
    "serving_latency": Table(
        "serving_latency",
        [
            Column("transport", transport, "l"),
            number("clients", "clients", ""),
            number("p50 ms", "p50_ms"),
            number("p99 ms", "p99_ms"),
            number("sentences/s", "sentences_per_s", ".1f"),
            number("tokens/s", "tokens_per_s", ",.1f"),
            Column("of embed", lambda run, r: pct(r.get("of_embed"))),
            Column("p50 / in-process", lambda run, r: times(r.get("p50_over_in_process"))),
        ],
        runs=newest(kind="full"),
        caption=model_caption,
    ),
    "serving_latency_grid": Table(
        "serving_latency",
        [text("model", "preset"), Column("clients", lambda run, r: str(r["clients"]))]
        + [Column(f"{TRANSPORTS[t]} p50 ms / sent/s", grid_cell(t)) for t in GRID_TRANSPORTS],
        runs=newest(kind="grid"),
        rows=grid_rows,
        caption=the_run(),
    ),
    "serving_latency_before_after": Table(
        "serving_latency",
        [
            Column("clients", lambda run, r: str(r["clients"])),
            Column("transport", transport, "l"),
            Column(lambda h, runs: f"{runs[0]['label']}: p50 ms / sent/s", lambda run, r: latency_pair(r)),
            Column(lambda h, runs: f"{runs[1]['label']}: p50 ms / sent/s", lambda run, r: latency_pair(r["after"])),
            Column(
                "p50 / in-process",
                lambda run, r: pair(r.get("p50_over_in_process"), r["after"].get("p50_over_in_process"), ".2f", " -> "),
            ),
        ],
        runs=two_quick_runs,
        rows=before_after_rows,
        caption=before_after_caption,
    ),
    "serving_latency_quick": Table(
        "serving_latency",
        [
            Column("date", quick_date, "l"),
            Column("run", lambda run, r: run.get("label", DASH), "l"),
            Column("transport", transport, "l"),
            Column("clients", lambda run, r: str(r["clients"])),
            Column("sent/s / in-process", lambda run, r: times(r.get("sentences_over_in_process"))),
            Column("p50 / in-process", lambda run, r: times(r.get("p50_over_in_process"))),
            Column("tok/s of embed", lambda run, r: pct(r.get("of_embed"))),
        ],
        runs=lambda h: [r for kind in ("quick_ratios", "quick_packed") for r in of_kinds(kind)(h)],
    ),
    "serving_precision": Table(
        "serving_latency",
        [
            Column("transport", transport, "l"),
            Column("clients", lambda run, r: DASH if r["clients"] is None else str(r["clients"])),
            Column("precision", lambda run, r: r["precision"], "l"),
            number("p50 ms", "p50_ms"),
            number("p99 ms", "p99_ms"),
            number("sentences/s", "sentences_per_s", ".1f"),
            number("tokens/s", "tokens_per_s", ",.1f"),
            Column("vs float32", lambda run, r: times(r.get("over_float32"))),
        ],
        runs=newest(kind="precision"),
        caption=model_caption,
    ),
    "serving_metrics": Table(
        "serving_latency",
        [text("transport or measure", "what"), text("clients", "clients", "r"), text("sentences/s", "value", "r")],
        runs=newest(kind="metrics"),
        rows=metrics_rows,
        caption=the_run(),
    ),
}


# ------------------------------------------------------------------------------------------------ train_throughput


def base_of(runs):
    """The commit the newest of the side-by-side training runs `runs` compares with (its `baseline`)."""
    return runs[-1]["baseline"]


def per_round(run, r):
    text = ", ".join(
        f"{fmt(x['baseline'], ',.0f')} / {fmt(x['ours'], ',.0f')} ({times(x['speedup'])})" for x in r.get("rounds", [])
    )
    return text or DASH


def roofline_shares(low_precision):
    """The "% of roofline" cell: ours / the baseline's, or (bfloat16 runs) ours of the float32 / bfloat16 rooflines."""
    if low_precision:
        return lambda run, r: (
            f"{pct(r['ours_fraction_of_roofline'])} / {pct(r.get('ours_fraction_of_low_precision_roofline'))}"
            f" ({run['baseline']} {pct(r['baseline_fraction_of_roofline'])})"
        )
    return lambda run, r: pair(r["ours_fraction_of_roofline"], r["baseline_fraction_of_roofline"], ".0%")


def side_by_side(kind, low_precision=False):
    """The newest training run of `kind` against the baseline commit: targets/s, speed-up, share of the roofline."""
    fraction = (
        (lambda h, runs: f"% of float32 / bfloat16 roofline ({base_of(runs)} float32)")
        if low_precision
        else (lambda h, runs: f"% roofline ours / {base_of(runs)}")
    )
    return Table(
        "train_throughput",
        [
            Column("config", lambda run, r: r["config"], "l"),
            number("params", "params", ""),
            number("sampled", "num_sampled", ","),
            number("ours targets/s", "ours_targets_per_s"),
            number(lambda h, runs: f"{base_of(runs)} targets/s", "baseline_targets_per_s"),
            Column("speed-up", lambda run, r: f"**{times(r['speedup'])}**"),
            Column(fraction, roofline_shares(low_precision)),
            Column(
                lambda h, runs: f"peak RSS MB ours / {base_of(runs)}",
                lambda run, r: pair(r["ours_peak_rss_mb"], r["baseline_peak_rss_mb"]),
            ),
            Column(lambda h, runs: f"per round ({base_of(runs)} / ours)", per_round, "l"),
        ],
        runs=newest(kind=kind),
        caption=the_run(),
    )


def speedup_cell(config):
    def cell(run, row):
        r = row.get(config)
        if r is None:
            return DASH
        text = times(r["speedup"])
        if r["ours_targets_per_s"] is not None:
            text += f" ({fmt(r['ours_targets_per_s'], ',.0f')} / {fmt(r['baseline_targets_per_s'], ',.0f')})"
        if r.get("speedup_per_round") and not r.get("rounds"):
            text += "; rounds " + ", ".join(f"{x:.2f}" for x in r["speedup_per_round"])
        return text

    return cell


def what_changed(run, r):
    what = run.get("change") or ""
    if run.get("matmul_precision") == "bfloat16":
        what = (what + "; " if what else "") + "bfloat16 matmuls"
    return what or DASH


def ab_rounds(run, r):
    rounds = r.get("speedup_per_round") or [x["speedup"] for x in r.get("rounds", [])]
    return ", ".join(f"{x:.2f}x" for x in rounds) or DASH


def profile_columns(h, runs):
    configs = runs[-1]["profile"].get("configs", ["ptb5m", "original"])
    return [Column("part", lambda run, p: p["part"], "l")] + [
        Column(f"{c} ms (GFLOP/s, % of roofline)", profile_cell(c)) for c in configs
    ]


def profile_cell(c):
    def cell(run, p):
        ms, gflops, frac = p.get(f"{c}_ms"), p.get(f"{c}_gflops"), p.get(f"{c}_fraction_of_roofline")
        return fmt(ms, ",.0f") + ("" if gflops is None else f" ({gflops:.0f}, {pct(frac)})")

    return cell


TRAIN_TABLES = {
    "train_throughput": side_by_side("vs_baseline"),
    "train_throughput_bf16": side_by_side("vs_baseline_bf16", low_precision=True),
    "train_throughput_history": Table(
        "train_throughput",
        [
            DATE,
            Column("session", lambda run, r: fmt(run.get("session"))),
            COMMIT,
            Column("rounds", lambda run, r: str(run.get("rounds", DASH))),
            Column("roofline", lambda run, r: roof(run)),
            Column(lambda h, runs: f"ptb5m (ours / {base_of(runs)} targets/s)", speedup_cell("ptb5m")),
            Column(lambda h, runs: f"original (ours / {base_of(runs)} targets/s)", speedup_cell("original")),
            Column("what changed", what_changed, "l"),
        ],
        runs=of_kinds("vs_baseline", "vs_baseline_bf16"),
        rows=lambda h, runs: [(run, {r["config"]: r for r in run["rows"]}) for run in runs],
    ),
    "train_throughput_ab": Table(
        "train_throughput",
        [
            DATE,
            COMMIT,
            Column(
                "change",
                lambda run, r: (
                    run.get("change") or ("bfloat16 against float32 matmuls" if run["kind"] == "bf16_vs_fp32" else DASH)
                ),
                "l",
            ),
            Column("against", lambda run, r: fmt(run.get("baseline")), "l"),
            Column("config", lambda run, r: fmt(r["config"], none="not named"), "l"),
            Column("speed-up", lambda run, r: times(r["speedup"])),
            Column("per round", ab_rounds),
        ],
        runs=of_kinds("ab", "bf16_vs_fp32"),
    ),
    "train_throughput_profile": Table(
        "train_throughput",
        profile_columns,
        runs=newest_with(lambda r: r.get("profile") and r.get("kind") == "vs_baseline"),
        rows=lambda h, runs: [(runs[-1], p) for p in runs[-1]["profile"]["rows"]],
        caption=lambda h, runs, pairs: [
            f"*Batch: {escape(runs[-1]['profile']['batch'])}.* " + the_run()(h, runs, pairs)[0]
        ],
    ),
}
SPEED_TABLES = {**EMBED_TABLES, **SERVING_TABLES, **TRAIN_TABLES}
