"""The history files of bench/results/history/, one per benchmark (`{"benchmark", "command", "runs": [RUN, ...]}`,
oldest run first), and `record`: a bench script's --out JSON turned into a RUN and appended to its history. The
standard library and elmo_tf only."""

import datetime
import glob
import json
import os
import subprocess

from elmo_tf.io.atomic import write_json
from elmo_tf.machine import cpu_description

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HISTORY = os.path.join(HERE, "results", "history")
REQUIRED_RUN_KEYS = ("date", "commit", "cpu", "roofline_gflops", "source")
# The commit before the training work, bench/train_throughput.py's default --baseline: a training run against it is
# of kind "vs_baseline" ("vs_baseline_bf16" with bfloat16 matmuls), its `baseline` field naming it; a run against any
# other commit measures one change ("ab"), or bfloat16 against float32 at the same commit ("bf16_vs_fp32").
REFERENCE_BASELINE = "97bf9b2"


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


def _median(value):
    """A summary field's median (`common.spread`'s dict) or the value itself; None stays None."""
    return value["median"] if isinstance(value, dict) else value


def summary_rows(result):
    """The rows of a run with interleaved rounds (its `summary`): each (batch, order, variant) once, at the median of
    its rounds, with the ratio's min, max and spread."""
    per_token = result["matmul_flops_per_position"]
    rows = []
    for r in result["summary"]:
        tokens_per_s = _median(r["tokens_per_s"])
        row = {
            "batch_size": r["batch_size"],
            "order": r["order"],
            "variant": r.get("variant"),
            "precision": r.get("precision", "float32"),
            "rounds": r["rounds"],
            "ours_tokens_per_s": tokens_per_s,
            "peer_tokens_per_s": _median(r.get("peer_tokens_per_s")),
            "ratio": _median(r.get("ratio")),
            "ours_gflops": tokens_per_s * per_token / 1e9,
            "fraction_of_roofline": _median(r["fraction_of_roofline"]),
            "ours_peak_rss_mib": r.get("peak_rss_mib"),
            "peer_peak_rss_mib": r.get("peer_peak_rss_mib"),
            "row_fill": None,
            "speedup_vs_default": _median(r.get("speedup_vs_default")),
        }
        for key in ("ratio", "ratio_vs_embedder"):
            if isinstance(r.get(key), dict):
                row[key] = r[key]["median"]
                row[f"{key}_range"] = [r[key]["min"], r[key]["max"]]
                row[f"{key}_spread"] = r[key]["spread"]
        rows.append(row)
    return rows


def adapt_embed_throughput(result):
    """A RUN of embed_throughput from bench/embed_throughput.py's --out JSON (a run with a `summary` of interleaved
    rounds: its median rows, `summary_rows`)."""
    run = run_header(result)
    rows = [] if not result.get("summary") else summary_rows(result)
    for r in [] if rows else result["runs"]:
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
    elif any(r.get("precision", "float32") != "float32" for r in result["runs"]):
        scope = "precision"  # float32 beside bfloat16 (issue 51): its own table, not the float32 headline
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
    # keyed by precision too (issue 51: a run may hold float32 and bfloat16 rows); results before it are float32
    ratios = {
        (x["preset"], x["transport"], x.get("precision", "float32"), x["concurrency"]): x
        for x in result.get("overheads", [])
    }
    rows = []
    for r in result["rows"]:
        precision = r.get("precision", "float32")
        x = ratios.get((r["preset"], r["transport"], precision, r["concurrency"]), {})
        rows.append(
            {
                "preset": r["preset"],
                "transport": r["transport"],
                "precision": precision,
                "over_float32": x.get("over_float32"),
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
    if result.get("quick"):
        kind = "quick_recorded"
    elif any(r["precision"] != "float32" for r in rows):
        kind = "precision"  # float32 beside bfloat16 (issue 51): its own table, not the float32 headline
    else:
        kind = "full"
    run.update(
        kind=kind,
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
    if rev.startswith(REFERENCE_BASELINE):
        kind, rev = "vs_baseline" if precision == "float32" else "vs_baseline_bf16", REFERENCE_BASELINE
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
