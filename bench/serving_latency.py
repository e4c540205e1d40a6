"""Serving latency and throughput: the embedded model server over gRPC and REST vs the same model in-process and vs
`embed`, the library's own batch path.

Spec: for each model size (--presets, default small and original: `elmo_tf.config.PRESETS`, random weights), requests
of --request-batch sentences (8) of natural English (bench/sentences.py), at concurrency 1, 8 and 32 (client
threads, each sending requests back to back), measured
    in-process    the SavedModel's `default` signature called directly by the client threads (no server);
    grpc          `ElmoClient.embed` against `serving/serve.py --embedded` (batching on, the default);
    rest          `ElmoRestClient.embed` (JSON "inputs" format) against the same server;
    grpc-nobatch  `ElmoClient.embed` against the server with --enable_batching=false;
    grpc-nometrics  `ElmoClient.embed` against a server without --monitoring_config_file (the others have the
                  Prometheus metrics on, export/monitoring.config);
    embed         `elmo_tf.embed.Embedder` (what `elmo-tf embed --layers all` runs) in this process on the same pool of
                  sentences, --embed-batch sentences per call (32: the server's max_batch_size, the most one merged
                  call holds), once before the servers start and once after they stop;
p50/p99 latency per request, sentences/s and tokens/s (whitespace tokens of the sentences answered), all in one run,
with the serving overhead as ratios to in-process (p50 latency ratio, throughput ratio) and each transport's tokens/s
as a fraction of embed's ("of embed"). All outputs are returned unless --output-filter names some.
--precision float32,bfloat16 (issue 51): every transport (and embed) against an export of each precision (the same
seeded weights, `ELMo(precision=...)`; a server each), interleaved in the same rounds; the rows say their precision
and "bfloat16 / float32" compares their sentences/s per transport and concurrency (gRPC at 32 clients: issue 51's
row). Default float32 only.
Targets: gRPC p50 under 1.10 x in-process at concurrency 1 (batch 8); batching raises throughput at concurrency 32
(grpc sentences/s > grpc-nobatch sentences/s); at concurrency 32 gRPC reaches 80% of embed's tokens/s and REST 60%
(issue 27's goal at the original shapes); with the Prometheus metrics on, gRPC's sentences/s at concurrency 32 within
3% of the server without them (issue 40).

How it is measured:
  - the model is exported once per preset (seeded random weights, `elmo_tf.saved_model.export.export_elmo`) into
    --cache (bench/results/cache/serving/<preset>-seed<seed>/elmo/1) and reused;
  - the server is a subprocess (`serving/serve.py --embedded`, its default threads, REST on; the batching server
    reads --batching-config, export/batching.config by default: the parameters shipped for stock TF Serving);
    clients run in this process, one gRPC channel or HTTP connection per client thread, so client work
    (serialization, JSON) is part of the measured latency, as it is for a real caller on the same machine;
  - every client first sends one untimed request (all at once); a timed phase starts when all threads are
    ready; throughput = timed sentences / wall time of the timed phases;
  - transports are interleaved: per concurrency, --rounds rounds (3) each run a block of every transport in turn
    (servers idle meanwhile), and results are pooled, so load drifts of a shared machine hit all alike.
Run it on an otherwise idle machine: client and server share the CPU (the JSON records the load average).

usage: .venv/bin/python bench/serving_latency.py [--quick] [--presets small,original] [--precision float32,bfloat16]
       [--concurrency 1,8,32] [--transports in-process,grpc,rest,grpc-nobatch] ... (--help lists them all)
"""

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from common import REPO, RESULTS, parse_list, result_fields, write_result  # noqa: E402
from model_server import Server, ensure_export  # noqa: E402
from request_load import close_callers, make_callers, measure, summarize  # noqa: E402
from sentences import load_sentences  # noqa: E402

DEFAULT_OUT = os.path.join(RESULTS, "serving_latency.json")
DEFAULT_CACHE = os.path.join(RESULTS, "cache", "serving")
TRANSPORTS = ("in-process", "grpc", "rest", "grpc-nobatch", "grpc-nometrics")
# the server each served transport talks to: (batching, Prometheus metrics on)
SERVER_OF = {"grpc": (True, True), "rest": (True, True), "grpc-nobatch": (False, True), "grpc-nometrics": (True, False)}
TARGET_GRPC_OVERHEAD = 1.10
TARGET_OF_EMBED = {"grpc": 0.80, "rest": 0.60}  # issue 27, at the original shapes
EMBED_BATCH = 32  # the embedded server's max_batch_size, and export/batching.config's
BATCHING_CONFIG = os.path.join(REPO, "export", "batching.config")

log = logging.getLogger("serving_latency")


def bench_sentences(n, data):
    """Natural sentences from the shared corpus; synthetic ones (recorded as such) when it is missing."""
    try:
        return load_sentences(n, data), "corpus"
    except (FileNotFoundError, ValueError) as e:
        log.warning("%s: using synthetic sentences", e)
        rng = np.random.default_rng(0)
        words = ["the", "market", "said", "on", "Tuesday", "government", "officials", ",", ".", "people", "in"]
        return [" ".join(rng.choice(words, size=int(rng.integers(5, 45)))) for _ in range(n)], "synthetic"


def export_for(preset, seed, cache, precision):
    """The base of `preset`'s export computing in `precision`: float32's is `ensure_export`'s; another has the same
    seeded weights, exported with `ELMo(precision=...)` into `<cache>/<preset>-seed<seed>-<precision>/elmo` once."""
    if precision == "float32":
        return ensure_export(preset, seed, cache)
    base = os.path.join(cache, f"{preset}-seed{seed}-{precision}", "elmo")
    if not os.path.isfile(os.path.join(base, "1", "saved_model.pb")):
        import keras

        from elmo_tf import ELMo, get_config
        from elmo_tf.saved_model.export import export_elmo

        log.info("exporting a random %s model computing in %s to %s (once)", preset, precision, base)
        keras.utils.set_random_seed(seed)
        export_elmo(ELMo(get_config(preset), precision=precision), base, version=1)
    return base


# ---------------------------------------------------------------------------------------------------- measuring


def measure_embed(preset, seed, sentences, batch_size, count, repeats=1, precision="float32"):
    """`elmo_tf.embed.Embedder` (what `elmo-tf embed --layers all` runs: packed rows, each distinct token through the
    char CNN once) in this process, on the first `count` sentences of the pool, `batch_size` sentences per call (the
    server's max_batch_size: the most a merged call holds), after one untimed call; `repeats` timed passes.
    Returns {"sentences_per_s", "tokens_per_s", "wall_s", "sentences", "tokens"}."""
    import keras

    from elmo_tf import ELMo, get_config
    from elmo_tf.embed import Embedder

    keras.utils.set_random_seed(seed)  # the exported model's weights (ensure_export seeds the same way)
    embedder = Embedder(ELMo(get_config(preset), precision=precision), layers="all")
    token_lists = [s.split() for s in sentences[:count]]
    embedder.embed_batch(token_lists[:batch_size])  # warm-up: traces the functions
    tokens = sum(len(t) for t in token_lists) * repeats
    start = time.perf_counter()
    for _ in range(repeats):
        for k in range(0, len(token_lists), batch_size):
            embedder.embed_batch(token_lists[k : k + batch_size])
    wall, sentences = time.perf_counter() - start, len(token_lists) * repeats
    return dict(
        sentences=sentences, tokens=tokens, wall_s=wall, sentences_per_s=sentences / wall, tokens_per_s=tokens / wall
    )


def in_process_caller(base, output_filter):
    """`make_caller` of the SavedModel's `default` signature called in this process, and the loaded model (kept
    alive while it is measured)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(base, "1"))
    function = loaded.signatures["default"]
    wanted = set(output_filter) if output_filter else None

    def make_inprocess():
        def call(batch):
            out = function(sentences=tf.constant(batch))
            return {k: v.numpy() for k, v in out.items() if wanted is None or k in wanted}

        return call

    return make_inprocess, loaded


def client_caller(server, rest, output_filter):
    """`make_caller` of `ElmoRestClient.embed` (`rest`) or `ElmoClient.embed` against `server`, a client each."""
    from elmo_tf.serving.client import ElmoClient
    from elmo_tf.serving.rest_client import ElmoRestClient

    def make():
        client = (
            ElmoRestClient(f"http://127.0.0.1:{server.rest_port}", "elmo", timeout=600)
            if rest
            else ElmoClient(f"127.0.0.1:{server.port}", "elmo", timeout=600)
        )

        def call(batch):
            return client.embed(batch, output_filter=output_filter)

        call.close = client.close
        return call

    return make


def start_servers(args, preset, base, results_dir, servers, precision="float32"):
    """Starts the servers of the export `base` (computing in `precision`) that the asked transports talk to (into
    `servers`, keyed by `SERVER_OF`'s (batching, metrics) and the precision), each waited for; returns `make_caller`
    per served transport, keyed by (transport, precision)."""
    callers = {}
    for (batching, monitoring), names in (
        ((True, True), ("grpc", "rest")),
        ((False, True), ("grpc-nobatch",)),
        ((True, False), ("grpc-nometrics",)),
    ):
        if not set(names) & set(args.transports):
            continue
        kind = ("batch" if batching else "nobatch") + ("" if monitoring else "-nometrics")
        kind += "" if precision == "float32" else f"-{precision}"
        log_path = os.path.join(results_dir, f"server-{preset}-{kind}.log")
        flags = [*args.server_flags]
        if batching and args.batching_config:
            flags = ["--batching_parameters_file", args.batching_config, *flags]
        server = servers[(batching, monitoring, precision)] = Server(base, batching, log_path, flags, monitoring)
        server.wait(args.server_timeout)
        for name in (n for n in names if n in args.transports):
            callers[(name, precision)] = client_caller(server, name == "rest", args.output_filter or None)
    return callers


def measure_rounds(args, callers, servers, sentences, concurrency):
    """Every transport (of every precision: `callers` keyed by (transport, precision)) at one concurrency,
    interleaved: --rounds rounds that each run a block of every one in turn; per key the latencies, wall time,
    errors, server counters and tokens pooled over the rounds."""
    names = sorted(callers, key=lambda key: (TRANSPORTS.index(key[0]), args.precision.index(key[1])))
    pooled = {name: ([], 0.0, [], {}, 0) for name in names}
    per_round = -(-requests_for(args, concurrency) // args.rounds)
    ready = {name: make_callers(callers[name], concurrency, sentences, args.request_batch) for name in names}
    for round_ in range(args.rounds):
        for name in names:
            server = servers.get((*SERVER_OF[name[0]], name[1])) if name[0] != "in-process" else None
            before = server.metrics() if server else {}
            latencies, wall, errors, tokens = measure(
                ready[name], per_round, sentences, args.request_batch, offset=round_ * per_round
            )
            after = server.metrics() if server else {}
            lat, total, errs, counters, total_tokens = pooled[name]
            lat.extend(latencies)
            errs.extend(errors)
            for k in after:
                counters[k] = counters.get(k, 0) + after[k] - before.get(k, 0)
            pooled[name] = (lat, total + wall, errs, counters, total_tokens + tokens)
    for name in names:
        close_callers(ready[name])
    return pooled


def transport_row(args, preset, key, concurrency, pooled):
    """The result row of transport `key` ((name, precision)) at `concurrency` from its pooled measurements (logged)."""
    (name, precision), (lat, wall, errs, counters, tokens) = key, pooled
    row = dict(preset=preset, transport=name, precision=precision, concurrency=concurrency)
    row.update(
        request_batch=args.request_batch, rounds=args.rounds, **summarize(lat, wall, errs, args.request_batch, tokens)
    )
    if name != "in-process":
        row["server_counters"] = counters
    log.info(
        "%s %-12s %-8s c=%-3d p50 %8.1f ms  p99 %8.1f ms  %7.1f sentences/s  (%d errors)",
        *(preset, name, precision, concurrency),
        *(row[k] or float("nan") for k in ("p50_ms", "p99_ms", "sentences_per_s")),
        row["errors"],
    )
    return row


def embed_row(args, preset, embed_runs, precision="float32"):
    """The `embed` row: its runs before and after the servers pooled."""
    wall = sum(r["wall_s"] for r in embed_runs)
    row = dict(preset=preset, transport="embed", precision=precision, concurrency=1, request_batch=args.embed_batch)
    row.update(rounds=len(embed_runs), requests=sum(-(-r["sentences"] // args.embed_batch) for r in embed_runs))
    row.update(errors=0, first_errors=[], p50_ms=None, p99_ms=None, mean_ms=None)
    row.update(sentences_per_s=sum(r["sentences"] for r in embed_runs) / wall)
    row.update(tokens_per_s=sum(r["tokens"] for r in embed_runs) / wall, wall_s=wall, runs=embed_runs)
    return row


def run_preset(args, preset, sentences, results_dir):
    """Measures every transport at every concurrency, interleaved: for each concurrency, `--rounds` rounds that
    each run a block of every transport in turn (both servers stay up, idle while not measured), so drifts of
    the machine's load touch all transports alike. Latencies and wall times are pooled over the rounds; `embed`
    runs before the servers start and after they stop (its rows first), per --precision."""
    bases = {p: export_for(preset, args.seed, args.cache, p) for p in args.precision}
    if not args.embed_sentences:
        return run_served(args, preset, sentences, results_dir, bases)
    before = {p: run_embed(args, preset, sentences, "before", p) for p in args.precision}
    rows = run_served(args, preset, sentences, results_dir, bases)
    after = {p: run_embed(args, preset, sentences, "after", p) for p in args.precision}
    return [*(embed_row(args, preset, [before[p], after[p]], p) for p in args.precision), *rows]


def run_embed(args, preset, sentences, when, precision="float32"):
    """`measure_embed` on --embed-sentences sentences, logged as `when` ("before"/"after") the servers."""
    run = measure_embed(preset, args.seed, sentences, args.embed_batch, args.embed_sentences, precision=precision)
    log.info("%s embed (%s): %.1f tokens/s (%s the servers)", preset, precision, run["tokens_per_s"], when)
    return run


def run_served(args, preset, sentences, results_dir, bases):
    """The rows of every transport but `embed` at every concurrency, for the export of each precision (`bases`:
    {precision: base path}; the servers up meanwhile)."""
    servers, callers, loaded, rows = {}, {}, [], []
    try:
        for precision, base in bases.items():
            if "in-process" in args.transports:
                callers[("in-process", precision)], model = in_process_caller(base, args.output_filter or None)
                loaded.append(model)
            callers.update(start_servers(args, preset, base, results_dir, servers, precision))
        for c in args.concurrency:
            pooled = measure_rounds(args, callers, servers, sentences, c)
            rows += [transport_row(args, preset, name, c, pooled[name]) for name in pooled]
    finally:
        for server in servers.values():
            server.stop()
        del loaded
    return rows


def requests_for(args, concurrency):
    return max(args.requests, args.min_per_client * concurrency)


def overheads(rows):
    """Per preset, precision, transport and concurrency: p50 and throughput ratios of each served transport to
    in-process, and every transport's tokens/s as a fraction of `embed`'s (the efficiency), each within its precision;
    with two precisions, the sentences/s of each bfloat16 row over its float32 row ("bfloat16 / float32")."""
    base = {(r["preset"], r["precision"], r["concurrency"]): r for r in rows if r["transport"] == "in-process"}
    embed = {(r["preset"], r["precision"]): r for r in rows if r["transport"] == "embed"}
    float32 = {(r["preset"], r["transport"], r["concurrency"]): r for r in rows if r["precision"] == "float32"}
    out = []
    for r in rows:
        ref, model = base.get((r["preset"], r["precision"], r["concurrency"])), embed.get((r["preset"], r["precision"]))
        entry = {k: r[k] for k in ("preset", "transport", "precision", "concurrency")}
        other = float32.get((r["preset"], r["transport"], r["concurrency"]))
        if r["precision"] != "float32" and other and other["sentences_per_s"] and r["sentences_per_s"]:
            entry["over_float32"] = r["sentences_per_s"] / other["sentences_per_s"]
        if r["transport"] == "embed":
            out += [entry] if "over_float32" in entry else []
            continue
        if r["transport"] != "in-process" and ref is not None and r["p50_ms"] and ref["p50_ms"]:
            entry["p50_ratio"] = r["p50_ms"] / ref["p50_ms"]
            entry["throughput_ratio"] = r["sentences_per_s"] / ref["sentences_per_s"]
        if model is not None and r["tokens_per_s"] and model["tokens_per_s"]:
            entry["of_embed"] = r["tokens_per_s"] / model["tokens_per_s"]
        out.append(entry)
    return out


def _ratio(index, a, b, key):
    """`index[a][key] / index[b][key]`, or None when either row or value is missing."""
    x, y = index.get(a), index.get(b)
    return x[key] / y[key] if x and y and x[key] and y[key] else None


def check_targets(rows):
    """The targets of the module docstring, on the float32 rows (the issues' targets were set in float32)."""
    index = {(r["preset"], r["transport"], r["concurrency"]): r for r in rows if r["precision"] == "float32"}
    targets = []
    for preset in sorted({key[0] for key in index}):
        checks = [
            (_ratio(index, (preset, t, 32), (preset, "embed", 1), "tokens_per_s"), goal, ">=")
            + (f"{t} tokens/s >= {goal:.0%} of embed's at concurrency 32",)
            for t, goal in TARGET_OF_EMBED.items()
        ]
        checks.append(
            (_ratio(index, (preset, "grpc", 1), (preset, "in-process", 1), "p50_ms"), TARGET_GRPC_OVERHEAD, "<")
            + (f"gRPC p50 < {TARGET_GRPC_OVERHEAD} x in-process at concurrency 1",)
        )
        for other, text, minimum, op in (
            ("grpc-nobatch", "batching raises gRPC throughput at concurrency 32", 1.0, ">"),  # strictly above
            ("grpc-nometrics", "gRPC throughput with metrics on >= 0.97 x off at concurrency 32", 0.97, ">="),
        ):
            checks.append(
                (_ratio(index, (preset, "grpc", 32), (preset, other, 32), "sentences_per_s"), minimum, op, text)
            )
        for value, goal, op, text in checks:
            if value is not None:
                met = {">=": value >= goal, ">": value > goal, "<": value < goal}[op]
                targets.append({"preset": preset, "target": text, "value": value, "met": met})
    return targets


# the ratio columns of the table: (key of `overheads`' entries, format, unit), then calls/req
RATIO_CELLS = (("of_embed", ".0%", ""), ("p50_ratio", ".2f", "x"), ("throughput_ratio", ".2f", "x"))
RATIO_CELLS += (("over_float32", ".2f", "x"),)


def _cell(value, spec, width):
    return format(value, spec) if value is not None else f"{'-':>{width}}"


def print_table(rows, ratios, targets):
    ratio_of = {(x["preset"], x["transport"], x["precision"], x["concurrency"]): x for x in ratios}
    names = ("p50 ms", "p99 ms", "sent/s", "tok/s", "of embed", "p50 / in-proc", "sent/s / in-proc", "bf16 / f32")
    widths = (9, 9, 8, 8, 8, 13, 16, 10, 9)
    header = f"{'preset':<9} {'transport':<13} {'precision':<9} {'conc':>4} " + " ".join(
        f"{name:>{width}}" for name, width in zip((*names, "calls/req"), widths)
    )
    print(header + "\n" + "-" * len(header))
    for r in rows:
        x = ratio_of.get((r["preset"], r["transport"], r["precision"], r["concurrency"])) or {}
        counters = r.get("server_counters") or {}
        calls = f"{counters['model_calls'] / counters['requests']:.2f}" if counters.get("requests") else ""
        measured = [_cell(r["p50_ms"], "9.1f", 9), _cell(r["p99_ms"], "9.1f", 9)]
        measured += [_cell(r["sentences_per_s"], "8.1f", 8), _cell(r.get("tokens_per_s"), "8.1f", 8)]
        cells = [format(x[key], spec) + unit if key in x else "" for key, spec, unit in RATIO_CELLS] + [calls]
        cells = [f"{cell:>{width}}" for cell, width in zip(cells, widths[4:])]
        errors = f"  ({r['errors']} errors)" if r["errors"] else ""
        conc = r["concurrency"] if r["transport"] != "embed" else "-"
        line = f"{r['preset']:<9} {r['transport']:<13} {r['precision']:<9} {conc:>4} "
        print(line + " ".join(measured + cells) + errors)
    for t in targets:
        print(f"target [{t['preset']}] {t['target']}: {t['value']:.3f} -> {'met' if t['met'] else 'MISSED'}")


# the flags but --quick and --check: (flag, type, default, help); None defaults depend on --quick (`check_args`)
FLAGS = (
    ("--presets", str, None, "comma-separated BiLMConfig presets (small,original)"),
    ("--concurrency", str, "1,8,32", "comma-separated client threads (1,8,32)"),
    ("--request-batch", int, 8, "sentences per request (8)"),
    ("--requests", int, None, "timed requests per configuration, at least (60; --quick 24)"),
    ("--rounds", int, None, "interleaved rounds per concurrency, each running every transport in turn (3; --quick 2)"),
    ("--min-per-client", int, None, "timed requests per client thread, at least (4; --quick 2)"),
    ("--transports", str, ",".join(TRANSPORTS), f"subset of {','.join(TRANSPORTS)}"),
    ("--output-filter", str, "", "comma-separated outputs to return (default: all)"),
    ("--n-sentences", int, 2000, "corpus sentences to draw from (2000)"),
    ("--data", str, None, "sentence corpus (default: see bench/sentences.py)"),
    ("--seed", int, 0, "seed of the random weights (0)"),
    ("--cache", str, DEFAULT_CACHE, "where exports are kept (bench/results/cache/serving)"),
    ("--embed-sentences", int, None, "sentences `embed` runs on, before and after the servers (640; --quick 128)"),
    ("--embed-batch", int, EMBED_BATCH, f"sentences per `embed` call ({EMBED_BATCH})"),
    ("--batching-config", str, BATCHING_CONFIG, "the batching server's --batching_parameters_file ('': the defaults)"),
    ("--server-timeout", float, 600, "seconds to wait for a server (600)"),
    ("--precision", str, "float32", "comma-separated precisions of the exports, side by side (float32,bfloat16)"),
    ("--out", str, DEFAULT_OUT, "JSON results (bench/results/serving_latency.json)"),
)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small model, fewer requests (2 to 4 minutes)")
    for flag, kind, default, text in FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        dest="server_flags",
        help="extra serve.py flag for both servers, e.g. --server-flag=--max_batch_size=64",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return parser


def check_args(args):
    """Parses the list flags and fills the --quick-dependent defaults in `args`; ValueError naming a bad flag."""
    try:
        args.concurrency = parse_list(args.concurrency, int, "--concurrency")
        args.transports = parse_list(args.transports, str, "--transports")
        args.presets = parse_list(args.presets or ("small" if args.quick else "small,original"), str, "--presets")
        args.precision = parse_list(args.precision, str, "--precision")
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    if not set(args.precision) <= {"float32", "bfloat16"}:
        raise ValueError(f"--precision: each of float32, bfloat16, got {args.precision}")
    unknown = set(args.transports) - set(TRANSPORTS)
    if unknown:
        raise ValueError(f"--transports: unknown {sorted(unknown)}")
    if args.request_batch < 1 or min(args.concurrency) < 1 or args.embed_batch < 1:
        raise ValueError("--request-batch, --embed-batch and --concurrency must be >= 1")
    from elmo_tf.config import PRESETS

    for preset in args.presets:
        if preset not in PRESETS:
            raise ValueError(f"--presets: unknown {preset!r} (choose from {sorted(PRESETS)})")
    args.requests = args.requests or (24 if args.quick else 60)
    args.min_per_client = args.min_per_client or (2 if args.quick else 4)
    args.rounds = args.rounds or (2 if args.quick else 3)
    if args.embed_sentences is None:
        args.embed_sentences = 128 if args.quick else 640
    args.output_filter = [x for x in args.output_filter.split(",") if x]


SETTINGS = (
    *("presets", "concurrency", "request_batch", "requests", "min_per_client", "rounds", "transports"),
    *("output_filter", "sentences", "server_flags", "batching_config", "embed_sentences", "embed_batch", "seed"),
    "precision",
)


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_args(args)
    except ValueError as e:
        print(f"serving_latency.py: error: {e}", file=sys.stderr)
        return 2
    results_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(results_dir, exist_ok=True)
    sentences, args.sentences = bench_sentences(max(args.n_sentences, 4 * args.request_batch), args.data)
    load_before, started = os.getloadavg(), time.time()
    rows = [row for preset in args.presets for row in run_preset(args, preset, sentences, results_dir)]
    ratios, targets = overheads(rows), check_targets(rows)
    print_table(rows, ratios, targets)
    settings = {k: getattr(args, k) for k in SETTINGS}
    result = {
        "benchmark": "serving_latency",
        **result_fields(load_before),  # git_commit, date, cpu: what bench/tables.py record names the run by
        "quick": args.quick,
        "settings": dict(settings, output_filter=args.output_filter or "all"),
        "duration_s": time.time() - started,
        "rows": rows,
        "overheads": ratios,
        "targets": targets,
    }
    write_result(args.out, result)
    if any(r["errors"] for r in rows):
        log.error("some requests failed (see first_errors in %s)", args.out)
        return 1
    if args.check and not all(t["met"] for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
