"""`elmo-tf serve`'s flags against a golden record of them (tests/cli/test_serve_flags.json): every flag's name,
group, help text (and so the default it shows), its parse and the `ServerOptions` it reaches, the stock server's argv
and the error of a bad value. Written before the flags were derived from `ServerOptions` (issue 50) to prove that
nothing changed; a flag changed on purpose is recorded again with `python tests/cli/test_serve_flags.py`.

The parse of the defaults shows "cpu" for the batch threads (`min(os.cpu_count(), MAX_BATCH_THREADS)`), so the record
holds on any machine."""

import argparse
import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path

GOLDEN = Path(__file__).with_suffix(".json")
ARGVS = [
    [],
    ["--model_base_path", "/m"],
    *[
        "--port 0 --grpc_socket_path /s --rest_api_port=8501 --enable_batching=false --enable_model_warmup "
        "--max_tokens_per_sentence 0 --max_request_tokens=0 --host 0.0.0.0 --max_batch_size 8 "
        "--batch_timeout_micros 100 --num_batch_threads 3 --file_system_poll_wait_seconds 0.5 --drain_grace_seconds 2 "
        "--allow_version_labels_for_unavailable_models=yes --rest_api_max_body_bytes 1000 -v "
        "--mixed_precision bfloat16".split(),
        "--grpc_socket_path= --enable_grpc_healthcheck_service --model_name m --model_base_path /m "
        "--tensorflow_intra_op_parallelism 2 --tensorflow_inter_op_parallelism=1 --max_message_bytes 1024 --unknown=1 "
        "--embedded --rest_api_num_threads 4 --rest_api_timeout_in_ms 5 --max_num_load_retries 0 "
        "--load_retry_interval_micros 7 --grpc_max_threads 2 --enable_batching --rest_api_max_bytes_in_flight 99 "
        "--max_requests_in_flight 3 --max_request_sentences 4 --model_config_file_poll_wait_seconds 5 "
        "--enable_model_warmup=0 --port=9000 --file_system_poll_wait_seconds 3".split(),
        "--model_config_file /c --batching_parameters_file /b --ssl_config_file /s --monitoring_config_file /mon "
        "--verbose".split(),
    ],
]
BAD = [
    *("--port x", "--rest_api_port 70000", "--max_batch_size 0", "--batch_timeout_micros -1"),
    *("--num_batch_threads 5000", "--file_system_poll_wait_seconds 0", "--enable_batching=maybe"),
    *("--max_request_sentences 0", "--max_tokens_per_sentence -1", "--drain_grace_seconds -1", "--grpc_max_threads 0"),
    *("--tensorflow_intra_op_parallelism -1", "--max_message_bytes 0", "--model_config_file_poll_wait_seconds -1"),
    *("--rest_api_max_body_bytes 0", "--host"),
]
BATCHING_FLAGS = ("max_batch_size", "batch_timeout_micros", "num_batch_threads")


def snapshot():
    """The flags, their parses and errors as JSON values (what the golden file holds)."""
    from elmo_tf.cli import serve

    parser = serve.build_parser("serve.py")
    flags = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            flags[" ".join(action.option_strings)] = {
                "group": group.title,
                "dest": action.dest,
                "help": action.help,
                "nargs": action.nargs,
                "const": action.const,
                "default": str(action.default),
            }
    cpu = min(os.cpu_count() or 1, 1024)
    parses = []
    for argv in ARGVS:
        given_ns, extra = parser.parse_known_args(argv)
        given = vars(given_ns)
        args = argparse.Namespace(**{**serve.DEFAULTS, **given})
        batching = {name: getattr(args, name) for name in BATCHING_FLAGS if getattr(args, name) is not None}
        options = dataclasses.asdict(serve.server_options(args, batching, {"prometheus_path": None, "ssl": None}))
        if options["batching"]["num_threads"] == cpu:
            options["batching"]["num_threads"] = "cpu"
        stock = serve.stock_command("tfs", given, extra)
        parses.append(
            {"argv": argv, "given": given, "extra": extra, "args": vars(args), "options": options, "stock": stock}
        )
    errors = {}
    for argv in BAD:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            parser.parse_known_args(argv.split())
        errors[argv] = err.getvalue().splitlines()[-1]
    record = {
        "defaults": dict(serve.DEFAULTS),
        "flags": flags,
        "parses": parses,
        "errors": errors,
        "tf_serving_flags": sorted(serve.TF_SERVING_FLAGS),
        "embedded_flags": sorted(serve.EMBEDDED_FLAGS),
    }
    return json.loads(json.dumps(record))  # tuples as lists, as the file holds them


def test_the_flags_defaults_help_and_parses_are_as_recorded():
    expected, found = json.loads(GOLDEN.read_text()), snapshot()
    assert found.keys() == expected.keys()
    for key in expected:
        if isinstance(expected[key], dict):
            for name in expected[key].keys() | found[key].keys():
                assert found[key].get(name) == expected[key].get(name), (key, name)
        elif key == "parses":
            for parse, recorded in zip(found[key], expected[key], strict=True):
                for part in recorded:
                    assert parse[part] == recorded[part], (recorded["argv"], part)
        else:
            assert found[key] == expected[key], key


def test_every_flag_is_one_field():
    from elmo_tf.cli.serve_flags import EMBEDDED_FLAGS, FIELDS, TF_SERVING_FLAGS

    flags = TF_SERVING_FLAGS + EMBEDDED_FLAGS
    assert len(set(flags)) == len(flags) and set(flags) == set(FIELDS)


def test_the_default_command_line_is_the_default_server_options():
    """The command line adds no default of its own to the server's: its defaults give `ServerOptions()`, but for the
    batch threads (one per CPU)."""
    from elmo_tf.cli import serve
    from elmo_tf.serving.options import ServerOptions

    default = ServerOptions()
    options = serve.server_options(argparse.Namespace(**serve.DEFAULTS), {}, {"prometheus_path": None, "ssl": None})
    threads = dataclasses.replace(options.batching, num_threads=default.batching.num_threads)
    assert dataclasses.replace(options, batching=threads) == default


def test_the_defaults_the_help_shows_of_modules_that_load_tensorflow_are_theirs():
    """`BatchingOptions` and the REST front hold these defaults; their modules load gRPC and TensorFlow, which --help
    does not, so the help writes them out."""
    from elmo_tf.cli import serve
    from elmo_tf.serving.batching.scheduler import BatchingOptions
    from elmo_tf.serving.rest.rest_front import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BYTES_IN_FLIGHT

    helps = {action.dest: action.help for action in serve.build_parser()._actions}
    assert f"({BatchingOptions().max_batch_size})" in helps["max_batch_size"]
    assert BatchingOptions().batch_timeout == 0 and "(0: " in helps["batch_timeout_micros"]
    assert f"({DEFAULT_MAX_BODY_BYTES})" in helps["rest_api_max_body_bytes"]
    assert f"({DEFAULT_MAX_BYTES_IN_FLIGHT})" in helps["rest_api_max_bytes_in_flight"]


if __name__ == "__main__":
    print(json.dumps(snapshot(), indent=1, sort_keys=True))
