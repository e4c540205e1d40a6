"""The quality tables (pretrain_ptb perplexities, ner_quality F1, peer_parity differences) as data:
`QUALITY_TABLES` maps a table ID to a `Table` (bench/table_render.py). The standard library only."""

from table_render import (
    COMMIT,
    DASH,
    DATE,
    Column,
    Table,
    each_row,
    fmt,
    join,
    newest_with,
    sci,
    text,
    the_run,
    the_runs,
    when,
)

# ------------------------------------------------------------------------------------------------ pretrain_ptb


def ptb_cell(of_run, of_reference):
    """A pretrain_ptb cell: `of_run(run, row)` for a run's row, `of_reference(reference)` for a published anchor."""
    return lambda run, r: of_reference(r) if run is None else of_run(run, r)


def curve_columns(h, runs):
    points = runs[-1]["curve"]["rows"]
    return (
        [Column("minutes", lambda run, r: r[0], "l")]
        + [Column(str(p["minutes"]), lambda run, r, k=k: r[k + 1]) for k, p in enumerate(points)]
        + [Column("end: valid / test (full softmax)", lambda run, r: r[-1])]
    )


def curve_rows(h, runs):
    (run,) = runs
    points, r = run["curve"]["rows"], run["rows"][0]
    return [
        (run, ["epochs"] + [fmt(p["epochs"], "g") for p in points] + [fmt(r["epochs"], ".1f")]),
        (
            run,
            ["train perplexity"]
            + [fmt(p["train_perplexity"], "g") for p in points]
            + [f"{fmt(r['valid_avg'], '.1f')} / {fmt(r['test_avg'], '.1f')}"],
        ),
    ]


PTB_TABLES = {
    "pretrain_ptb": Table(
        "pretrain_ptb",
        [
            Column("date", ptb_cell(lambda run, r: when(run), lambda ref: DASH), "l"),
            Column("commit", ptb_cell(lambda run, r: fmt(run.get("commit")), lambda ref: DASH), "l"),
            Column("session", ptb_cell(lambda run, r: fmt(run.get("session")), lambda ref: DASH)),
            Column("run", ptb_cell(lambda run, r: run.get("label", DASH), lambda ref: ref["model"]), "l"),
            Column("params", ptb_cell(lambda run, r: fmt(r["params"]), lambda ref: ref["params"])),
            Column("steps", ptb_cell(lambda run, r: fmt(r["steps"], ","), lambda ref: DASH)),
            Column("epochs", ptb_cell(lambda run, r: fmt(r["epochs"], "g"), lambda ref: str(ref["epochs"]))),
            Column("training min", ptb_cell(lambda run, r: fmt(r["training_minutes"], "g"), lambda ref: DASH)),
            Column("targets/s", ptb_cell(lambda run, r: fmt(r["targets_per_s"], ",.0f"), lambda ref: DASH)),
            Column(
                "valid fwd / bwd / avg",
                ptb_cell(join("valid_fwd", "valid_bwd", "valid_avg"), lambda ref: fmt(ref["valid"], ".1f")),
            ),
            Column(
                "test fwd / bwd / avg",
                ptb_cell(join("test_fwd", "test_bwd", "test_avg"), lambda ref: fmt(ref["test"], ".1f")),
            ),
        ],
        rows=lambda h, runs: each_row(h, runs) + [(None, ref) for ref in h.get("references", [])],
    ),
    "pretrain_ptb_curve": Table(
        "pretrain_ptb",
        curve_columns,
        runs=newest_with(lambda r: r.get("curve")),
        rows=curve_rows,
        caption=the_run(),
    ),
}


# ------------------------------------------------------------------------------------------------ ner_quality


def f1(r, key):
    """A mean F1 with its standard deviation over seeds ("91.38 ± 0.33"), DASH when missing."""
    if r is None or r.get(key) is None:
        return DASH
    std = r.get(f"{key}_std")
    return f"{r[key]:.2f}" + ("" if std is None else f" ± {std:.2f}")


def by_dataset(run):
    """`(dataset, without ELMo, with ELMo, gain)` for each dataset of `run`, in the order of its rows."""
    cells = {(r["dataset"], r["variant"]): r for r in run["rows"]}
    gains = {g["dataset"]: g for g in run.get("gains", [])}
    return [
        (d, cells.get((d, "no ELMo")), cells.get((d, "ELMo")), gains.get(d, {}))
        for d in dict.fromkeys(r["dataset"] for r in run["rows"])
    ]


def newest_committed(h):
    """The newest run that names its commit."""
    return [r for r in h["runs"] if r.get("commit")][-1:]


def ner_summary_rows(h, runs):
    (run,) = runs
    return [(run, r) for r in dataset_rows(run)]


def dataset_rows(run):
    """One display row per dataset of `run`: its rows without and with ELMo, and the test gain."""
    return [{"dataset": d, "no": no, "yes": yes, "gain": g.get("test_gain")} for d, no, yes, g in by_dataset(run)]


def paper_cell(h):
    def cell(run, r):
        p = h.get("paper", {}).get(r["dataset"])
        return DASH if not p else f"{p['test_without']:.2f} -> {p['test_with']:.2f} ({p['gain']:+.2f})"

    return cell


def ner_summary_columns(h, runs):
    return [
        text("dataset", "dataset"),
        Column("without ELMo dev / test", lambda run, r: f"{f1(r['no'], 'dev_f1')} / {f1(r['no'], 'test_f1')}"),
        Column("with ELMo dev / test", lambda run, r: f"{f1(r['yes'], 'dev_f1')} / {f1(r['yes'], 'test_f1')}"),
        Column("ELMo gain (test)", lambda run, r: DASH if r["gain"] is None else f"{r['gain']:+.2f}"),
        Column("paper (test)", paper_cell(h)),
    ]


def ner_run_rows(h, runs):
    """Each variant's row, and after each dataset's last row its gain row."""
    (run,) = runs
    rows = list(run["rows"])
    for g in run.get("gains", []):
        at = max(k for k, r in enumerate(rows) if r["dataset"] == g["dataset"]) + 1
        rows.insert(at, {"dataset": g["dataset"], "gain": g})
    return [(run, r) for r in rows]


def gain_or(of_row, of_gain):
    return lambda run, r: of_gain(r["gain"]) if "gain" in r else of_row(r)


def bilm_text(run):
    bilm = run.get("bilm")
    if isinstance(bilm, dict):
        bilm = f"{bilm['minutes']}-minute {bilm['optimizer']} biLM, {bilm['epochs']} epochs (at {bilm['commit']})"
    return bilm or DASH


NER_TABLES = {
    "ner_quality": Table(
        "ner_quality", ner_summary_columns, runs=newest_committed, rows=ner_summary_rows, caption=the_run()
    ),
    "ner_quality_runs": Table(
        "ner_quality",
        [
            text("dataset", "dataset"),
            Column("variant", gain_or(lambda r: r["variant"], lambda g: "**gain**"), "l"),
            Column("dev F1 mean ± std", gain_or(lambda r: f1(r, "dev_f1"), lambda g: fmt(g["dev_gain"], "+.2f"))),
            Column(
                "test F1 mean ± std",
                gain_or(lambda r: f1(r, "test_f1"), lambda g: f"**{fmt(g['test_gain'], '+.2f')}**"),
            ),
            Column(
                "best epochs",
                gain_or(lambda r: ", ".join(str(e) for e in r["best_epochs"] or []) or DASH, lambda g: ""),
                "l",
            ),
            Column(
                "min/run",
                gain_or(
                    lambda r: (
                        fmt(r["minutes_per_run"], ".1f") + (f" ({r['minutes_note']})" if r.get("minutes_note") else "")
                    ),
                    lambda g: "",
                ),
            ),
        ],
        runs=newest_committed,
        rows=ner_run_rows,
        caption=the_run(),
    ),
    "ner_quality_history": Table(
        "ner_quality",
        [
            DATE,
            COMMIT,
            Column("biLM", lambda run, r: bilm_text(run), "l"),
            text("dataset", "dataset"),
            Column(
                "test F1 without -> with ELMo", lambda run, r: f"{r['no']['test_f1']:.2f} -> {r['yes']['test_f1']:.2f}"
            ),
            Column("gain", lambda run, r: fmt(r["gain"], "+.2f")),
        ],
        rows=lambda h, runs: [(run, r) for run in runs for r in dataset_rows(run)],
    ),
    "ner_quality_per_type": Table(
        "ner_quality",
        [
            text("dataset", "dataset"),
            text("type", "type"),
            Column("no ELMo", lambda run, t: f"{t['no_elmo']:.1f}"),
            Column("ELMo", lambda run, t: f"{t['elmo']:.1f}"),
        ],
        runs=newest_with(lambda r: r.get("per_type_test_f1")),
        rows=lambda h, runs: [(runs[-1], t) for t in runs[-1]["per_type_test_f1"]],
        caption=the_run(),
    ),
}


# ------------------------------------------------------------------------------------------------ peer_parity


def parity_rows(h, runs):
    """Each weight set of each run; a run that recorded only its verdict as one row."""
    return [(run, r) for run in runs for r in (run["rows"] or [{"status": "verdict"}])]


def parity_cell(key):
    def cell(run, r):
        if r["status"] == "verdict":
            return "as the run before" if key == "max_abs_diff" else DASH
        if r["status"] != "compared":
            return r["status"] if key == "layer0_max_abs_diff" else ""
        return sci(r[key])

    return cell


PARITY_TABLES = {
    "peer_parity": Table(
        "peer_parity",
        [
            DATE,
            COMMIT,
            Column(
                "weights",
                lambda run, r: f"all ({run.get('result', DASH)})" if r["status"] == "verdict" else r["weights"],
                "l",
            ),
            *(Column(f"layer {k}", parity_cell(f"layer{k}_max_abs_diff")) for k in range(3)),
            Column("max", parity_cell("max_abs_diff")),
        ],
        rows=parity_rows,
        caption=the_runs("*Max \\|ours - AllenNLP\\|; tolerance {h[tolerance]:g}.* "),
    ),
}
QUALITY_TABLES = {**PTB_TABLES, **NER_TABLES, **PARITY_TABLES}
