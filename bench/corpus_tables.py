"""The corpus-scale tables (lm_score, embed_resume, beam_throughput: scoring and embedding whole files, resuming,
float16 output, memory over a corpus, Beam) as data: `CORPUS_TABLES` maps a table ID to a `Table`
(bench/table_render.py). The standard library only."""

from table_render import (
    COMMIT,
    DASH,
    DATE,
    ROW_COMMIT,
    Column,
    Table,
    each_row,
    measured,
    number,
    pair,
    raw,
    sci,
    text,
    the_runs,
)


def float16_rows(h, runs):
    """The float16 measurements as display rows: the file size against float32, and each rounding error."""
    rows = []
    for run, r in each_row(h, runs):
        if r["measure"] == "float16_size":
            width = f", width {r['width']}" if r.get("width") else ""
            what = f"float16 / float32 file size, {r['lines']:,} lines{width}"
            value = raw(r["ratio"])
            if r.get("float16_mb"):
                value += f" ({r['float16_mb']:,} / {r['float32_mb']:,} MB)"
        elif r["measure"] == "rounding_error":
            what = f"error: {r['what']}"
            value = " / ".join(sci(r[k]) for k in ("max_abs", "mean_abs", "max_rel"))
        else:
            continue
        rows.append((run, {"what": what, "value": value}))
    return rows


CORPUS_TABLES = {
    "lm_score": Table(
        "lm_score",
        [
            DATE,
            COMMIT,
            Column("run", lambda run, r: f"{run.get('label', DASH)} ({r['preset']}, {r['softmax']})", "l"),
            Column("sentences", lambda run, r: f"{r['sentences']} ({r['tokens']:,} tokens)"),
            number("embed sentences/s", "embed_sentences_per_s", ".1f"),
            number("score sentences/s", "score_sentences_per_s", ".1f"),
            number("softmax GFLOP/s", "softmax_gflops", "g"),
            number("peak RSS MiB", "peak_rss_mib"),
        ],
    ),
    "embed_resume": Table(
        "embed_resume",
        [
            DATE,
            ROW_COMMIT,
            Column("lines", lambda run, r: f"{r['lines']:,}"),
            Column(
                lambda h, runs: f"resumed / uninterrupted (target <= {h['targets']['resume_ratio_max']})",
                lambda run, r: f"**{r['ratio']:.2f}**" if r is run["rows"][0] else f"{r['ratio']:.2f}",
            ),
            Column("seconds", lambda run, r: pair(r["resumed_s"], r["uninterrupted_s"], ".1f")),
            number("start-up s", "startup_s", ".1f"),
            Column("bitwise identical", lambda run, r: "yes" if r["identical"] else "no"),
        ],
        rows=measured("resume"),
        caption=the_runs(shown=True),
    ),
    "embed_resume_float16": Table(
        "embed_resume",
        [DATE, COMMIT, text("measure", "what"), text("value (errors: max abs / mean abs / max rel)", "value", "r")],
        rows=float16_rows,
        caption=the_runs("*Target: float16 / float32 size <= {h[targets][float16_size_ratio_max]}.* ", shown=True),
    ),
    "embed_resume_rss": Table(
        "embed_resume",
        [
            DATE,
            ROW_COMMIT,
            Column("variant", lambda run, r: r.get("variant") or DASH, "l"),
            Column(
                lambda h, runs: f"100,000 / 1,000 lines (target <= {h['targets']['rss_ratio_max']:.2f})",
                lambda run, r: raw(r["ratio"]),
            ),
            Column("peak RSS MiB", lambda run, r: pair(r["rss_large_mib"], r["rss_small_mib"])),
        ],
        rows=measured("peak_rss"),
        caption=the_runs(shown=True),
    ),
    "beam_throughput": Table(
        "beam_throughput",
        [
            DATE,
            COMMIT,
            Column("lines", lambda run, r: r["lines"] if isinstance(r["lines"], str) else f"{r['lines']:,}"),
            Column(
                lambda h, runs: f"Beam / embed (target >= {h['targets']['ratio_min']})",
                lambda run, r: f"{r['ratio']:.2f}",
            ),
            Column("tokens/s Beam / embed", lambda run, r: pair(r["beam_tokens_per_s"], r["embed_tokens_per_s"])),
            Column(
                "merged shards: max abs diff",
                lambda run, r: sci(run.get("merged_max_abs_diff")) if r is run["rows"][0] else "",
            ),
        ],
        caption=the_runs(
            "*Beam: {h[setup][beam]}; embed: {h[setup][embed]}; {h[setup][preset]} shapes, batch "
            "{h[setup][batch]}; marginal: start-up excluded.* "
        ),
    ),
}
