"""bench/tables.py: the benchmark tables of README.md, docs/ and bench/README.md agree with bench/results/history."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from elmo_tf.machine import cpu_description

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
HISTORY = os.path.join(BENCH, "results", "history")


def _load_tables():
    if BENCH not in sys.path:  # tables.py imports its neighbours (history.py, table_render.py, ...) as a script does
        sys.path.append(BENCH)
    spec = importlib.util.spec_from_file_location("bench_tables", os.path.join(BENCH, "tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _load_tables()


@pytest.fixture
def history(tmp_path):
    """A copy of bench/results/history the test may change."""
    return shutil.copytree(HISTORY, tmp_path / "history")


def _repo_with(tmp_path, text, name="README.md"):
    """A directory standing for the repository, holding one Markdown file `name` with `text`."""
    repo = tmp_path / "repo"
    (repo / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(text, encoding="utf-8")
    return repo


def test_every_marked_region_equals_its_table():
    problems = tables.check(REPO, HISTORY)
    assert problems == [], "\n".join(problems) + "\n(python bench/tables.py --write regenerates them)"


def test_the_marked_files_are_readme_bench_readme_and_docs():
    files = {os.path.relpath(p, REPO) for p in tables.marked_files(REPO)}
    assert {"README.md", os.path.join("bench", "README.md"), os.path.join("docs", "benchmarks.md")} <= files


def test_every_history_file_parses_and_names_each_run():
    names = tables.history_names(HISTORY)
    for name in ("embed_throughput", "serving_latency", "train_throughput", "pretrain_ptb", "ner_quality"):
        assert name in names
    for name in names:
        h = tables.load_history(name, HISTORY)
        assert h["command"].startswith(".venv/bin/python bench/"), name
        assert h["runs"], name
        for k, run in enumerate(h["runs"]):
            where = f"{name} run {k}"
            for key in tables.REQUIRED_RUN_KEYS:
                assert key in run, f"{where}: no {key!r}"
            assert run["date"] is None or re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"]), where
            assert run["commit"] is None or re.fullmatch(r"[0-9a-f]{7,40}", run["commit"]), where
            assert run["roofline_gflops"] is None or isinstance(run["roofline_gflops"], (int, float)), where
            assert isinstance(run["cpu"], str) and run["cpu"], where
            assert isinstance(run["source"], str) and run["source"], where
            assert isinstance(run.get("rows"), list), where
            if run["date"] is None or run["commit"] is None:
                assert run.get("date_note") or run.get("note") or run.get("notes"), f"{where}: says nothing of why"


def test_every_table_renders_with_a_caption_naming_the_rerun_command():
    for table_id in tables.TABLES:
        text = tables.render(table_id, HISTORY)
        assert text.startswith("| "), table_id
        assert "Rerun: `" in text or table_id == "durations" or table_id.endswith("_durations"), table_id


def test_every_table_id_is_in_a_marked_region():
    """So test_every_marked_region_equals_its_table compares every table with the Markdown committed before."""
    used = set()
    for path in tables.marked_files(REPO):
        with open(path, encoding="utf-8") as f:
            used |= {m["id"] for m in tables.MARKER.finditer(f.read())}
    assert used == set(tables.TABLES)


# A line of each table, from each history file: the data-driven renderers (bench/speed_tables.py, corpus_tables.py,
# quality_tables.py) print what the hand-written renderers before them printed, to the character.
KEY_LINES = {
    "embed_throughput_full": "| 64, sorted, +cache | 869 | - | - | (1.07x the default) | 2,173 | 99% |",
    "embed_backends": "| 32, sorted | TensorFlow, the Embedder |",
    "embed_precision": "| 256, sorted | bfloat16 | 510 | 0.83x | 261 | 1.96x | 2,251 |",
    "embed_throughput_history": "| all | - | - |",
    "serving_latency": "*Model: ",
    "serving_latency_grid": "| model | clients | in-process p50 ms / sent/s | gRPC p50 ms / sent/s |",
    "serving_latency_before_after": "*Before:* *Commit ",
    "serving_latency_quick": "| date | run | transport | clients | sent/s / in-process |",
    "serving_metrics": "| one scrape (timeit) | - |",
    "train_throughput": "| ptb5m | 5.28M | 2,048 | 1,635 | 810 | **2.02x** | 42% / 21% | 1,384 / 1,877 |",
    "train_throughput_bf16": "| original | - | - | 694 | 266 | **2.60x** | 93% / 54% (97bf9b2 36%) |",
    "train_throughput_history": "| date | session | commit | rounds | roofline | ptb5m (ours / 97bf9b2 targets/s) |",
    "train_throughput_ab": "| date | commit | change | against | config | speed-up | per round |",
    "train_throughput_profile": "| part | ptb5m ms (GFLOP/s, % of roofline) |",
    "pretrain_ptb": "| 2026-11-23 | 1de75fd | 5 | 110 min | 5.28M | 6,231 | 9.48 | 110 | 1,335 | 120.7 / 118.7 /",
    "pretrain_ptb_curve": "| train perplexity |",
    "ner_quality": "| CoNLL-2003 |",
    "ner_quality_runs": "| WNUT-17 | **gain** | +12.37 | **+11.32** |  |  |",
    "ner_quality_history": "| date | commit | biLM | dataset | test F1 without -> with ELMo | gain |",
    "ner_quality_per_type": "| dataset | type | no ELMo | ELMo |",
    "lm_score": "| date | commit | run | sentences | embed sentences/s | score sentences/s |",
    "peer_parity": "| 2026-11-24 | 17b0980 | fixture_bilm_tf | AllenNLP cannot load it |  |  |  |",
    "embed_resume": "| 2026-11-26 | c27ba06 | 20,000 | **0.54** | 37.0 / 68.0 | 5.8 | yes |",
    "embed_resume_float16": "*Target: float16 / float32 size <= ",
    "embed_resume_rss": "| 2026-11-26 | c587b26 | TF_ENABLE_ONEDNN_OPTS=0 | 1.125 | 1,033 / 918 |",
    "beam_throughput": "| 2026-11-26 | c587b26 | marginal | 1.01 | 877 / 869 |  |",
    "durations": "| `peer_parity.py` | about a minute (44 s, session 10) |",
}


@pytest.mark.parametrize("table_id", sorted(KEY_LINES))
def test_each_table_renders_its_key_numbers(table_id):
    assert KEY_LINES[table_id] in tables.render(table_id, HISTORY)


def test_every_history_renders_its_durations():
    for name in tables.history_names(HISTORY):
        text = tables.render(f"{name}_durations", HISTORY)
        assert text.startswith("| script, mode | one run | from |\n|---|---|---|\n| `"), name


def test_the_headline_is_the_latest_full_run_against_allennlp():
    text = tables.render("embed_throughput", HISTORY)
    assert "*Commit 726b013, 2026-11-25" in text
    assert "| 32, length-sorted | 762 | 206 | 3.70x | 156 (71%) | 1,690 / 1,635 |" in text
    assert "roofline: 220 GFLOP/s" in text
    assert "no memo" not in text and "+cache" not in text


def test_a_changed_number_in_the_history_is_reported(tmp_path, history):
    repo = _repo_with(tmp_path, "# t\n\n<!-- bench-table: embed_throughput -->\n<!-- /bench-table -->\n")
    changed, problems = tables.write(repo, history)
    assert changed == ["README.md"] and problems == []
    assert tables.check(repo, history) == []
    path = history / "embed_throughput.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    full = [r for r in data["runs"] if r.get("scope") == "full"][-1]
    full["rows"][0]["ours_tokens_per_s"] = 763
    path.write_text(json.dumps(data), encoding="utf-8")
    problems = tables.check(repo, history)
    assert len(problems) == 1 and problems[0].startswith("README.md:3: bench-table 'embed_throughput' differs")
    assert tables.main(["--check", "--repo", str(repo), "--history-dir", str(history)]) == 1


def test_an_edited_table_is_reported(tmp_path):
    repo = _repo_with(tmp_path, "<!-- bench-table: lm_score -->\n<!-- /bench-table -->\n", "docs/x.md")
    tables.write(repo, HISTORY)
    text = (repo / "docs" / "x.md").read_text(encoding="utf-8")
    (repo / "docs" / "x.md").write_text(text.replace("3.9", "4.9"), encoding="utf-8")
    assert [p.split(": ")[0] for p in tables.check(repo, HISTORY)] == [os.path.join("docs", "x.md:1")]


def test_an_unknown_table_id_and_a_missing_closing_marker_are_reported(tmp_path):
    text = "<!-- bench-table: no_such_table -->\n<!-- /bench-table -->\n\n<!-- bench-table: lm_score -->\n"
    repo = _repo_with(tmp_path, text)
    problems = tables.check(repo, HISTORY)
    assert any("README.md:1:" in p and "'no_such_table': unknown" in p for p in problems), problems
    assert any("README.md:4:" in p and "no closing" in p for p in problems), problems
    assert tables.main(["--check", "--repo", str(repo), "--history-dir", str(HISTORY)]) == 1
    with pytest.raises(ValueError, match="table ID 'no_such_table': unknown"):
        tables.render("no_such_table", HISTORY)


def _head():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def _short(commit):
    return subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()


def _matmul(best_1024, best_4096):
    return {"sizes": {"1024": {"best_gflops": best_1024}, "4096": {"best_gflops": best_4096}}, "best_gflops": 0}


def test_record_embed_throughput(tmp_path, history):
    ours = {"tokens_per_s": 900.0, "gflops": 183.9, "fraction_of_roofline": 0.8, "peak_rss_mib": 1600.0}
    result = {
        "roofline_gflops": 230.0,
        "matmul": [_matmul(150.0, 229.0), _matmul(160.0, 230.0)],
        "runs": [
            {
                "batch_size": 32,
                "order": "sorted",
                "repeat": 0,
                "ours": {**ours, "position_fill": 0.99},
                "peer": {"tokens_per_s": 300.0, "peak_rss_mib": 1700.0},
                "ratio": 3.0,
            },
            {
                "batch_size": 32,
                "order": "sorted",
                "repeat": 0,
                "variant": "+cache",
                "ours": {**ours, "tokens_per_s": 990.0, "position_fill": 0.99},
                "speedup_vs_default": 1.1,
            },
        ],
        "n_sentences": 1000,
        "n_tokens": 22077,
        "quick": False,
        "targets": {"missed": []},
        "git_commit": _head(),
        "date": "2026-12-01",
        "cpu": "2-core x86_64 (Test CPU; avx2)",
    }
    path = tmp_path / "embed.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    before = len(tables.load_history("embed_throughput", history)["runs"])
    assert tables.main(["record", "embed_throughput", str(path), "--history-dir", str(history)]) == 0
    runs = tables.load_history("embed_throughput", history)["runs"]
    assert len(runs) == before + 1
    run = runs[-1]
    assert (run["date"], run["commit"], run["cpu"], run["roofline_gflops"]) == (
        "2026-12-01",
        _short(_head()),
        "2-core x86_64 (Test CPU; avx2)",
        230.0,
    )
    assert run["source"] == "bench/tables.py record" and run["scope"] == "full"
    assert run["matmul_gflops"] == {"1024": [150.0, 160.0], "4096": [229.0, 230.0]}
    assert run["rows"][0]["peer_tokens_per_s"] == 300.0 and run["rows"][0]["ratio"] == 3.0
    assert run["rows"][1]["variant"] == "+cache" and run["rows"][1]["speedup_vs_default"] == 1.1
    text = tables.render("embed_throughput", history)
    assert "| 32, length-sorted | 900 | 300 | 3.00x | 184 (80%) | 1,600 / 1,700 |" in text
    assert "2026-12-01" in text and "Test CPU" in text and "230 GFLOP/s" in text


def test_record_serving_latency(tmp_path, history):
    row = {"preset": "original", "rounds": 3, "errors": 0}
    result = {
        "benchmark": "serving_latency",
        "commit": _head(),
        "quick": False,
        "duration_s": 480.0,
        "settings": {"presets": ["original"]},
        "rows": [
            {
                **row,
                "transport": "embed",
                "concurrency": 1,
                "p50_ms": None,
                "p99_ms": None,
                "sentences_per_s": 21.0,
                "tokens_per_s": 480.0,
            },  # fmt: skip
            {
                **row,
                "transport": "in-process",
                "concurrency": 1,
                "p50_ms": 680.0,
                "p99_ms": 900.0,
                "sentences_per_s": 11.5,
                "tokens_per_s": 259.0,
            },  # fmt: skip
            {
                **row,
                "transport": "grpc",
                "concurrency": 32,
                "p50_ms": 6500.0,
                "p99_ms": 11000.0,
                "sentences_per_s": 24.0,
                "tokens_per_s": 530.0,
            },  # fmt: skip
        ],
        "overheads": [
            {"preset": "original", "transport": "in-process", "concurrency": 1, "of_embed": 0.54},
            {
                "preset": "original",
                "transport": "grpc",
                "concurrency": 32,
                "of_embed": 1.104,
                "p50_ratio": 0.65,
                "throughput_ratio": 2.0,
            },  # fmt: skip
        ],
        "targets": [],
    }
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    run = tables.record("serving_latency", str(path), history)
    assert run["commit"] == _short(_head()) and run["roofline_gflops"] is None and run["kind"] == "full"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"])
    assert run["cpu"] == cpu_description() and run["cpu"].startswith(f"{os.cpu_count()}-core ")
    embed, _, grpc = run["rows"]
    assert embed["clients"] is None and embed["of_embed"] == 1.0
    assert (grpc["clients"], grpc["p50_ms"], grpc["of_embed"], grpc["p50_over_in_process"]) == (32, 6500.0, 1.104, 0.65)
    assert tables.load_history("serving_latency", history)["runs"][-1] == run
    assert "| gRPC | 32 | 6,500 | 11,000 | 24.0 | 530.0 | 110% | 0.65x |" in tables.render("serving_latency", history)


def test_a_serving_run_of_two_precisions_gets_its_own_table_not_the_float32_headline(tmp_path, history):
    """A run of `serving_latency.py --precision float32,bfloat16` (issue 51) is recorded as kind "precision": the
    `serving_precision` table shows it with its bfloat16 / float32 ratios, and `serving_latency` keeps the newest
    float32 run."""
    headline = tables.render("serving_latency", history)

    def row(transport, precision, concurrency, sentences_per_s, p50_ms=None, p99_ms=None):
        return dict(preset="original", rounds=3, errors=0, transport=transport, precision=precision,
                    concurrency=concurrency, sentences_per_s=sentences_per_s, p50_ms=p50_ms, p99_ms=p99_ms)  # fmt: skip

    def ratio(transport, concurrency, over_float32):
        return dict(preset="original", transport=transport, precision="bfloat16", concurrency=concurrency,
                    over_float32=over_float32)  # fmt: skip

    result = {
        "benchmark": "serving_latency",
        "commit": _head(),
        "quick": False,
        "rows": [
            row("embed", "float32", 1, 19.0),
            row("embed", "bfloat16", 1, 15.0),
            row("grpc", "float32", 32, 18.0, 9500.0, 17000.0),
            row("grpc", "bfloat16", 32, 16.0, 9500.0, 17000.0),
        ],
        "overheads": [ratio("embed", 1, 0.79), ratio("grpc", 32, 0.89)],
        "targets": [],
    }
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    run = tables.record("serving_latency", str(path), history)
    assert run["kind"] == "precision"
    text = tables.render("serving_precision", history)
    assert "| gRPC | 32 | bfloat16 | 9,500 | 17,000 | 16.0 | - | 0.89x |" in text
    assert "| embed | - | bfloat16 | - | - | 15.0 | - | 0.79x |" in text
    assert tables.render("serving_latency", history) == headline


def test_record_train_throughput(tmp_path, history):
    def worker(tps):
        return {"targets_per_s": tps}

    part = {"part": "whole step", "ms": 190.0, "flop": 1, "gflops": 196.0}
    result = {
        "benchmark": "train_throughput",
        "time": "2026-12-02T10:00:00",
        "commit": _head(),
        "date": "2026-12-02",
        "cpu": "2-core x86_64 (Test CPU)",
        "baseline": {"rev": "97bf9b2", "commit": "97bf9b2" + "0" * 33},
        "roofline_gflops": 490.0,
        "matmul_precision": "float32",
        "low_precision_roofline_gflops": None,
        "settings": {"rounds": 2},
        "results": [
            {
                "config": "ptb5m",
                "replicas": 1,
                "rounds": {"baseline": [worker(2700.0), worker(2800.0)], "ours": [worker(5400.0), worker(5600.0)]},
                "ours": {
                    "targets_per_s": 5600.0,
                    "gflops": 190.0,
                    "peak_rss_mb": 1350.0,
                    "params": 5280000,
                    "num_sampled": 2048,
                    "fraction_of_roofline": 0.39,
                },  # fmt: skip
                "baseline": {
                    "targets_per_s": 2800.0,
                    "gflops": 95.0,
                    "peak_rss_mb": 1850.0,
                    "fraction_of_roofline": 0.19,
                },  # fmt: skip
                "speedup": 2.0,
                "parts": {"rows": 64, "length": 20, "targets": 1093, "positions": 1408, "parts": [part]},
            }
        ],
    }
    path = tmp_path / "train.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    run = tables.record("train_throughput", str(path), history, command="bench/train_throughput.py --rounds 2")
    assert (run["date"], run["cpu"], run["roofline_gflops"], run["kind"], run["rounds"]) == (
        "2026-12-02",
        "2-core x86_64 (Test CPU)",
        490.0,
        "vs_baseline",
        2,
    )
    assert run["baseline"] == "97bf9b2"
    assert run["command"] == "bench/train_throughput.py --rounds 2"
    row = run["rows"][0]
    assert (row["params"], row["speedup"], row["ours_fraction_of_roofline"]) == ("5.28M", 2.0, 0.39)
    assert row["rounds"] == [
        {"baseline": 2700.0, "ours": 5400.0, "speedup": 2.0},
        {"baseline": 2800.0, "ours": 5600.0, "speedup": 2.0},
    ]
    assert run["profile"]["configs"] == ["ptb5m"] and run["profile"]["rows"][0]["ptb5m_ms"] == 190.0
    text = tables.render("train_throughput", history)
    assert "| ptb5m | 5.28M | 2,048 | 5,600 | 2,800 | **2.00x** | 39% / 19% | 1,350 / 1,850 |" in text
    assert "| whole step | 190 (196, 40%) |" in tables.render("train_throughput_profile", history)


def test_record_refuses_a_benchmark_without_an_adapter_and_a_foreign_file(tmp_path, history):
    path = tmp_path / "r.json"
    path.write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="record 'pretrain_ptb': no adapter"):
        tables.record("pretrain_ptb", str(path), history)
    with pytest.raises(ValueError, match="not the output of bench/embed_throughput.py"):
        tables.record("embed_throughput", str(path), history)
    assert tables.main(["record", "lm_score", str(path), "--history-dir", str(history)]) == 2


def test_no_text_says_a_table_predates_a_change():
    for path in tables.marked_files(REPO):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert not re.search(r"predates|still to be made", text, re.IGNORECASE), path


# ------------------------------------------------------------------------------ bench/embed_throughput.py's harness
# The logic of the side-by-side run, with fake measurements (no model, no timing): the rounds' interleaving, the
# ratios paired within a round, their spread, the targets, and the refusal of a run on shared cores.

embed_throughput = importlib.import_module("embed_throughput")  # bench/ is on sys.path (`_load_tables`)
bench_common = importlib.import_module("common")
SharedCores, spread = bench_common.SharedCores, bench_common.spread


def test_rounds_rotate_the_subjects():
    """Round r starts at subject r: over as many rounds as subjects, each subject takes each place once."""
    subjects = embed_throughput.subjects_of(False, ["jax", "torch"], ["float32"])
    assert subjects == [("ours", "float32"), ("peer", None), ("jax", "float32"), ("torch", "float32")]
    rounds = embed_throughput.rounds(subjects, 4)
    assert rounds[1] == subjects[1:] + subjects[:1] and all(sorted(r) == sorted(subjects) for r in rounds)
    assert {r.index(s) for r in rounds for s in subjects[:1]} == {0, 1, 2, 3}
    both = [("ours", "float32"), ("ours", "bfloat16")]
    assert embed_throughput.subjects_of(True, [], ["float32", "bfloat16"]) == both


def test_spread_is_max_minus_min_over_the_median():
    assert spread([2.0, 3.0, 2.5]) == {"median": 2.5, "min": 2.0, "max": 3.0, "spread": 0.4}
    assert spread([1.0, 3.0])["median"] == 2.0 and spread([4.0])["spread"] == 0.0


def _measured(tokens_per_s, share=0.0, rss=1000.0):
    return {"tokens_per_s": tokens_per_s, "tokens": 2200, "sentences": 100, "seconds": 2200 / tokens_per_s,
            "peak_rss_mib": rss, "position_fill": 0.9, "foreign_cpu_share": share}  # fmt: skip


def test_ratios_are_paired_within_a_round_and_summarized_with_their_spread():
    """Each measurement is divided by the peer's of its own round, a backend's by the Embedder's of its precision;
    the summary's medians, ranges and spreads are over the rounds, and the targets name what is missed."""
    runs = []
    for repeat, (ours, peer, jax) in enumerate([(900.0, 300.0, 200.0), (880.0, 400.0, 180.0), (910.0, 320.0, 300.0)]):
        got = {("ours", "float32"): _measured(ours), ("peer", None): _measured(peer, rss=2000.0),
               ("jax", "float32"): _measured(jax)}  # fmt: skip
        runs += embed_throughput.paired(32, "sorted", repeat, got)
    assert [r.get("variant") for r in runs] == [None, "jax"] * 3
    assert runs[2]["ratio"] == 880.0 / 400.0 and runs[3]["ratio_vs_embedder"] == 180.0 / 880.0
    embed_throughput.derive(runs, 2e8, {"float32": 200.0})
    assert runs[0]["ours"]["fraction_of_roofline"] == 900.0 * 0.2 / 200.0
    assert runs[0]["peer"]["fraction_of_roofline"] == 300.0 * 0.2 / 200.0
    summary = {row["variant"]: row for row in embed_throughput.summarize(runs)}
    embedder, jax = summary[None], summary["jax"]
    assert embedder["rounds"] == 3 and embedder["tokens_per_s"]["median"] == 900.0
    assert embedder["ratio"] == spread([3.0, 2.2, 910.0 / 320.0])
    assert jax["ratio_vs_embedder"]["median"] == 200.0 / 900.0 and jax["peer_peak_rss_mib"] == 2000.0
    missed = embed_throughput.targets_missed(list(summary.values()))
    assert not any("AllenNLP < 2.5x" in m for m in missed)  # the median, 2.84x
    assert "batch 32 sorted: ratio spread 28% over 3 rounds > 10%" in missed
    assert "batch 32 sorted jax: 0.22x the Embedder < 0.8x" in missed
    assert "batch 32 sorted jax: 0.67x AllenNLP < 1.0x" in missed
    assert not any(m.startswith("batch 32 sorted: peak RSS") for m in missed)


def test_a_bfloat16_row_is_its_own_variant_against_its_own_embedder():
    got = {("ours", "float32"): _measured(900.0), ("ours", "bfloat16"): _measured(1200.0),
           ("torch", "bfloat16"): _measured(600.0)}  # fmt: skip
    runs = embed_throughput.paired(64, "corpus", 0, got)
    assert [(r.get("variant"), r["precision"]) for r in runs] == [
        (None, "float32"), ("bfloat16", "bfloat16"), ("torch bfloat16", "bfloat16")]  # fmt: skip
    assert runs[2]["ratio_vs_embedder"] == 0.5 and "ratio" not in runs[2]
    embed_throughput.derive(runs, 1e9, {"float32": 100.0, "bfloat16": 400.0})
    assert runs[1]["ours"]["fraction_of_roofline"] == 1.2e12 / 1e9 / 400.0
    assert runs[1]["ours"]["fraction_of_float32_roofline"] == 1.2e12 / 1e9 / 100.0


def test_foreign_cpu_share_and_the_check():
    """The CPUs' busy time beside the measured process's own, over its wall time; over the limit, `SharedCores`."""
    share, check_alone = bench_common.foreign_cpu_share, bench_common.check_alone
    assert share(100.0, 103.0, 1.0, 2.0, cpus=2) == 0.5
    assert share(100.0, 100.5, 1.0, 2.0, cpus=2) == 0.0  # never below 0
    assert share(None, 1.0, 1.0, 1.0) is None
    check_alone("ours", 0.01, 0.05)
    check_alone("ours", None, 0.05)
    with pytest.raises(SharedCores, match="ours: other processes used 20% of the CPUs"):
        check_alone("ours", 0.2, 0.05)
    before = bench_common.busy_cpu_seconds()
    if before is None:
        pytest.skip("no /proc/stat")
    start = os.times()
    while os.times().user - start.user < 0.3:  # this process's own CPU time is part of the machine's
        pass
    assert bench_common.busy_cpu_seconds() - before >= 0.2


@pytest.fixture
def fake_measurements(monkeypatch, tmp_path):
    """embed_throughput's workers and peer replaced by fakes (`shares[subject]`: the foreign CPU share each reports);
    returns `(shares, out path, the argv of a run)`."""
    from elmo_tf.config import get_config

    options = tmp_path / "weights" / "options.json"
    options.parent.mkdir()
    options.write_text(json.dumps(get_config("small").to_options()), encoding="utf-8")
    shares = {"ours": 0.0, "peer": 0.0, "plain": 0.0, "matmul": 0.0}
    speeds = {"ours": 900.0, "peer": 300.0, "plain": 400.0, ("ours", "jax"): 720.0}  # ("ours", "jax"): the Embedder

    def worker(args, mode, extra, work, backend=None):
        if mode == "matmul":
            return {"best_gflops": 200.0, "sizes": {"1024": {"best_gflops": 200.0}}, "foreign_cpu_share": 0.0}
        return _measured(speeds.get((mode, backend), speeds[mode]), shares[mode])

    monkeypatch.setattr(embed_throughput, "run_embed_worker", worker)
    monkeypatch.setattr(embed_throughput, "run_peer", lambda *a: _measured(speeds["peer"], shares["peer"], 2000.0))
    monkeypatch.setattr(embed_throughput, "ensure_weights", lambda *a, **k: (str(options), None))
    monkeypatch.setattr(embed_throughput.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    out = tmp_path / "out.json"
    argv = ["--n-sentences", "5", "--batch-sizes", "32", "--orders", "sorted", "--no-cache", "--backend", "jax"]
    argv += ["--peer-python", sys.executable, "--peer-script", __file__, "--weights-dir", str(options.parent)]
    return shares, out, argv + ["--out", str(out)]


def test_a_run_alone_is_written_and_recorded(fake_measurements, tmp_path, history, capsys):
    """Three interleaved rounds: the JSON holds each round's runs and the summary; the printed table shows the
    medians and the spreads; `bench/tables.py record` keeps the medians with each ratio's range."""
    _, out, argv = fake_measurements
    assert embed_throughput.main(argv) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["repeats"] == 3 and len(result["runs"]) == 6 and result["cores_shared"] == []
    assert [row["variant"] for row in result["summary"]] == [None, "jax"]
    assert result["summary"][1]["ratio"]["median"] == 400.0 / 300.0
    printed = capsys.readouterr().out
    assert "32 sorted Embedder" in printed and "spread of ratio (32 sorted Embedder): 0.0%" in printed
    assert tables.main(["record", "embed_throughput", str(out), "--history-dir", str(history)]) == 0
    run = tables.load_history("embed_throughput", history)["runs"][-1]
    assert run["scope"] == "backends" and [(r["variant"], r["rounds"]) for r in run["rows"]] == [(None, 3), ("jax", 3)]
    jax_row = run["rows"][1]  # the medians of the rounds, with the ratios' ranges
    assert jax_row["ratio"] == 400.0 / 300.0 and jax_row["ratio_range"] == [400.0 / 300.0] * 2
    assert jax_row["ratio_vs_embedder"] == 400.0 / 900.0 and jax_row["ratio_spread"] == 0.0
    assert "| 32, sorted | jax, ELMo itself | 400 | 1.33x (1.33-1.33x) | 0.44x (0.44-0.44x) |" in tables.render(
        "embed_backends", history
    )


def test_the_embedder_on_jax_is_a_row_of_its_own(fake_measurements, tmp_path, history):
    """--embedder-backend jax runs the Embedder's worker under JAX beside ELMo itself under JAX: its row is "jax, the
    Embedder", compared with AllenNLP and with TensorFlow's Embedder of the same round; a backend it does not take is
    refused naming the flag."""
    _, out, argv = fake_measurements
    assert embed_throughput.main(argv + ["--embedder-backend", "jax"]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [row["variant"] for row in result["summary"]] == [None, "jax", "jax embedder"]
    row = result["summary"][2]
    assert row["ratio"]["median"] == 720.0 / 300.0 and row["ratio_vs_embedder"]["median"] == 0.8
    assert tables.main(["record", "embed_throughput", str(out), "--history-dir", str(history)]) == 0
    assert "| 32, sorted | jax, the Embedder | 720 | 2.40x (2.40-2.40x) | 0.80x (0.80-0.80x) |" in tables.render(
        "embed_backends", history
    )
    assert embed_throughput.main(argv + ["--embedder-backend", "tensorflow"]) == 2


@pytest.mark.parametrize("allow_shared", [False, True])
def test_a_run_beside_other_work_is_not_recorded(fake_measurements, allow_shared, capsys):
    """A measurement that saw other processes on the cores stops the run (exit 3), or with --allow-shared finishes it
    unrecorded: no JSON either way; a load average over --max-load refuses to start."""
    shares, out, argv = fake_measurements
    shares["peer"] = 0.3
    status = embed_throughput.main(argv + (["--allow-shared"] if allow_shared else []))
    assert not out.exists()
    if allow_shared:
        assert status == 0 and "not recorded: measured beside other work (peer" in capsys.readouterr().out
    else:
        assert status == 3 and "other processes used 30% of the CPUs" in capsys.readouterr().err
    shares["peer"] = 0.0
    embed_throughput.os.getloadavg = lambda: (1.5, 1.0, 1.0)  # (the fixture's monkeypatch restores it)
    assert embed_throughput.main(argv) == 3 and not out.exists()
    assert "load average 1.50 > --max-load 0.5" in capsys.readouterr().err
