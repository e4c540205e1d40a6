"""Version policies and version labels of `--model_config_file` (issue 38), against TF Serving's source at 9d981c5:
which versions are served (sources/storage_path/file_system_storage_path_source.cc, the Aspire*Versions functions),
when one is unloaded (core/availability_preserving_policy.cc), which a request gets (core/basic_manager.cc: a version
if it is AVAILABLE, the highest AVAILABLE one without), how labels are resolved and refused
(model_servers/server_core.cc ServableRequestFromModelSpec, GetModelVersionForLabel, UpdateModelVersionLabelMap) and
what the config file may hold (protobuf's text format, as main.cc's ParseProtoTextFile).

Real embedded servers on 127.0.0.1 with real gRPC and REST clients, warm-up off (each load ~0.5 s). The servers of
the `all` and `specific` tests never poll by themselves (a poll every 10 minutes): the tests poll after each change
on disk (`ServerCore.poll`, the poller's own call), so each step is one poll; the `latest` test uses the poller.
"""

import contextlib
import logging
import os
import shutil
import sys

import forked
import grpc
import pytest
import tensorflow as tf
from cli_testlib import own_lines
from rest_testlib import call
from serving_testlib import SERVE, VALID, copy_version, messages, statuses, wait_for
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.config_files import ModelConfig, VersionPolicy, parse_model_config
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.server import ModelServer
from elmo_tf.serving.serving_error import ServingError

NOT_FOUND = grpc.StatusCode.NOT_FOUND
NO_POLLING = 600.0  # seconds between polls: the test polls
ABSENT_5 = (
    "Version 5 of servable elmo, which was requested to be served as a 'specific' version in the servable's version "
    "policy, was not found in the file system"
)  # file_system_storage_path_source.cc AspireSpecificVersions


@pytest.fixture(scope="module")
def three_versions(base_path, tmp_path_factory):
    """A base path holding versions 1, 2 and 3 (copies of the shared version 1); tests copy it before changing it."""
    base = str(tmp_path_factory.mktemp("policy") / "elmo")
    shutil.copytree(base_path, base)
    for version in (2, 3):
        copy_version(base, "1", version)
    return base


@pytest.fixture
def versions_base(three_versions, tmp_path):
    base = str(tmp_path / "elmo")
    shutil.copytree(three_versions, base)
    return base


def write_config(directory, base, fields=""):
    """A model config file with one model, "elmo" at `base`, and the text proto `fields` in its config."""
    path = os.path.join(directory, "models.config")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'model_config_list {{ config {{ name: "elmo" base_path: "{base}" {fields} }} }}\n')
    return path


@contextlib.contextmanager
def serving(config_path, allow_labels=False, **options):
    """A started `ModelServer` of the config file (gRPC and REST on free ports, warm-up off, no retries)."""
    models = parse_model_config(config_path, allow_labels)
    settings = dict(
        port=0,
        rest_api_port=0,
        enable_model_warmup=False,
        max_num_load_retries=0,
        allow_version_labels_for_unavailable_models=allow_labels,
    )
    server = ModelServer(models, ServerOptions(**{**settings, **options})).start()
    try:
        yield server
    finally:
        server.stop(grace=1.0)


def client(server):
    return ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=30, max_retries=0)


def served_by(c, version=None):
    return c.embed(VALID, version=version).model_version


def refusal(call_):
    with pytest.raises(ServingError) as info:
        call_()
    return info.value.code, info.value.details


def predict_by_label(server, label):
    """The version that answers a gRPC Predict whose model spec names `label`."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.version_label = "elmo", label
    request.inputs["sentences"].CopyFrom(tf.make_tensor_proto(VALID, dtype=tf.string))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return response.model_spec.version.value


def grpc_refusal(call_):
    with pytest.raises(grpc.RpcError) as info:
        call_()
    return info.value.code(), info.value.details()


def status_by_label(server, label):
    request = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo", "version_label": label})
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
    state_name = get_model_status_pb2.ModelVersionStatus.State.Name
    return [(s.version, state_name(s.state)) for s in response.model_version_status]


def rest(server, path, body=None):
    return call(f"http://127.0.0.1:{server.rest_port}/v1/models/elmo{path}", "POST" if body else "GET", body)


def test_latest_n_serves_the_n_highest_and_moves_on_without_dropping_availability(versions_base, tmp_path):
    """`latest { num_versions: 2 }` over versions 1-3 serves 3 and 2 (AspireLatestVersions); version 1 is
    neither loaded nor listed. Version 4 loads; then 2 is unloaded, after the request that holds it ends (UNLOADING
    until then). A broken version 5 (END with its error) unloads nothing: 4 and 3 stay (a failed load never unloads;
    stock would also serve one fewer, the embedded server passes the place to the next version that loads)."""
    config = write_config(tmp_path, versions_base, "model_version_policy { latest { num_versions: 2 } }")
    with serving(config, file_system_poll_wait_seconds=0.05) as server, client(server) as c:
        manager = server.core.managers["elmo"]
        assert statuses(c) == [(3, "AVAILABLE"), (2, "AVAILABLE")]
        assert (served_by(c), served_by(c, 3), served_by(c, 2)) == (3, 3, 2)
        assert refusal(lambda: served_by(c, 1)) == (
            NOT_FOUND,
            "Servable not found for request: Specific(elmo, 1)",
        )
        with manager.acquire(2) as held:  # a request in flight on version 2
            copy_version(versions_base, "1", 4)
            wait_for(lambda: statuses(c) == [(4, "AVAILABLE"), (3, "AVAILABLE"), (2, "UNLOADING")], 30, "4 in, 2 out")
            assert served_by(c) == 4 and held.runners is not None
            assert refusal(lambda: served_by(c, 2))[0] == NOT_FOUND  # no new request on 2
        wait_for(lambda: (2, "END") in statuses(c), 30, "version 2 END once its request ended")
        os.makedirs(os.path.join(versions_base, "5"))
        with open(os.path.join(versions_base, "5", "saved_model.pb"), "wb") as f:
            f.write(b"not a SavedModel")
        wait_for(lambda: (5, "END") in statuses(c), 30, "version 5 refused")
        assert statuses(c)[:3] == [(5, "END"), (4, "AVAILABLE"), (3, "AVAILABLE")]
        assert (served_by(c), served_by(c, 3)) == (4, 3)


def test_all_serves_every_version_and_follows_the_disk(versions_base, tmp_path):
    """`all {}` (AspireAllVersions): every version on disk is AVAILABLE and answers requests for it; a new one
    loads beside them; one deleted from disk is unloaded (others are AVAILABLE), then forgotten."""
    config = write_config(tmp_path, versions_base, "model_version_policy { all {} }")
    with serving(config, rest_api_port=None, file_system_poll_wait_seconds=NO_POLLING) as server, client(server) as c:
        assert statuses(c) == [(3, "AVAILABLE"), (2, "AVAILABLE"), (1, "AVAILABLE")]
        assert [served_by(c, v) for v in (None, 1, 2, 3)] == [3, 1, 2, 3]
        copy_version(versions_base, "1", 4)
        server.core.poll()
        assert statuses(c) == [(4, "AVAILABLE"), (3, "AVAILABLE"), (2, "AVAILABLE"), (1, "AVAILABLE")]
        assert served_by(c) == 4
        shutil.rmtree(os.path.join(versions_base, "1"))
        server.core.poll()
        wait_for(lambda: (1, "END") in statuses(c), 30, "version 1 unloaded")
        server.core.poll()
        assert statuses(c) == [(4, "AVAILABLE"), (3, "AVAILABLE"), (2, "AVAILABLE")]
        assert refusal(lambda: served_by(c, 1))[0] == NOT_FOUND


def test_specific_pins_a_rollback_and_labels_resolve_over_grpc_and_rest(versions_base, tmp_path, caplog):
    """`specific { versions: [1, 5] }` over versions 1-3 (AspireSpecificVersions): the pinned rollback, 1, is served,
    also to a request without a version (the highest AVAILABLE); 5 is absent, with stock's warning (once here, every
    poll in stock). Labels (with --allow_version_labels_for_unavailable_models, else refused at start-up): "stable" -> 1
    answers over gRPC and REST, "canary" -> 5 is NOT_FOUND Specific(elmo, 5) until 5 is copied in, an unknown label is
    INVALID_ARGUMENT (server_core.cc ServableRequestFromModelSpec, GetModelVersionForLabel); GetModelStatus ignores
    labels (get_model_status_impl.cc GetModelStatusWithModelSpec). Deleting 1 unloads it (5 is AVAILABLE); deleting 5
    too leaves no selected version on disk, and, as stock (availability_preserving_policy.cc GetNextAction: no aspired
    version), nothing is served."""
    caplog.set_level(logging.WARNING, logger="elmo_tf.serving")
    fields = (
        "model_version_policy { specific { versions: [1, 5] } } "
        'version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 5 }'
    )
    config = write_config(tmp_path, versions_base, fields)
    with serving(config, allow_labels=True, file_system_poll_wait_seconds=NO_POLLING) as server, client(server) as c:
        assert statuses(c) == [(1, "AVAILABLE")]
        assert (served_by(c), served_by(c, 1)) == (1, 1)
        assert refusal(lambda: served_by(c, 3))[0] == NOT_FOUND
        server.core.poll()
        server.core.poll()
        assert messages(caplog, ABSENT_5) == [ABSENT_5]

        assert predict_by_label(server, "stable") == 1
        assert grpc_refusal(lambda: predict_by_label(server, "canary")) == (
            NOT_FOUND,
            "Servable not found for request: Specific(elmo, 5)",
        )
        assert grpc_refusal(lambda: predict_by_label(server, "nope")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: nope",
        )
        status, body = rest(server, "/labels/stable:predict", {"instances": VALID})
        assert status == 200 and len(body["predictions"]) == 2, body
        status, body = rest(server, "/labels/stable/metadata")
        assert status == 200 and body["model_spec"]["version"] == "1", body
        assert rest(server, "/labels/canary:predict", {"instances": VALID}) == (
            404,
            {"error": "Servable not found for request: Specific(elmo, 5)"},
        )
        assert status_by_label(server, "canary") == [(1, "AVAILABLE")]

        copy_version(versions_base, "1", 5)
        server.core.poll()
        assert statuses(c) == [(5, "AVAILABLE"), (1, "AVAILABLE")]
        assert (served_by(c), predict_by_label(server, "canary"), predict_by_label(server, "stable")) == (5, 5, 1)
        assert rest(server, "/labels/canary/metadata")[1]["model_spec"]["version"] == "5"
        status, body = rest(server, "/labels/stable")
        assert status == 200 and [s["version"] for s in body["model_version_status"]] == ["5", "1"], body

        shutil.rmtree(os.path.join(versions_base, "1"))
        server.core.poll()
        wait_for(lambda: statuses(c) == [(5, "AVAILABLE"), (1, "END")], 30, "version 1 unloaded")
        assert grpc_refusal(lambda: predict_by_label(server, "stable")) == (
            NOT_FOUND,
            "Servable not found for request: Specific(elmo, 1)",
        )
        shutil.rmtree(os.path.join(versions_base, "5"))
        server.core.poll()
        wait_for(lambda: (5, "END") in statuses(c), 30, "version 5 unloaded: no selected version on disk")
        assert refusal(lambda: served_by(c)) == (NOT_FOUND, "Servable not found for request: Latest(elmo)")


def test_an_empty_specific_policy_serves_nothing_with_a_warning(versions_base, tmp_path, caplog):
    """Stock takes `specific {}` and aspires nothing, warning "No specific versions requested for servable elmo."
    (file_system_storage_path_source.cc AspireSpecificVersionsFastPath); `latest { num_versions: 0 }` is latest 1
    (AspireLatestVersions)."""
    caplog.set_level(logging.WARNING, logger="elmo_tf.serving")
    config = write_config(tmp_path, versions_base, "model_version_policy { specific {} }")
    with serving(config, rest_api_port=None, file_system_poll_wait_seconds=NO_POLLING) as server, client(server) as c:
        assert messages(caplog, "No specific versions") == ["No specific versions requested for servable elmo."]
        assert refusal(c.model_status) == (NOT_FOUND, "Could not find any versions of model elmo")
        assert refusal(lambda: served_by(c)) == (NOT_FOUND, "Servable not found for request: Latest(elmo)")
    config = write_config(tmp_path, versions_base, "model_version_policy { latest { num_versions: 0 } }")
    assert parse_model_config(config)["elmo"].version_policy == VersionPolicy("latest", 1)


# What stock refuses at start-up: a file protobuf's text format refuses (main.cc ParseProtoTextFile), and every version
# label without --allow_version_labels_for_unavailable_models (server_core.cc UpdateModelVersionLabelMap: ReloadConfig
# assigns labels before any model loads, so no version is AVAILABLE yet). Each refusal is one line naming the file.
@pytest.mark.parametrize(
    "fields, needles",
    [
        ("model_version_policy { latest {} all {} }", ['"all" is specified along with field "latest"', "oneof"]),
        ("model_version_policy { latest { num_versions: -1 } }", ["Value out of range: -1"]),
        ("model_version_policy { newest {} }", ['no field named "newest"']),
        ("model_version_policy { specific { versions: 1.5 } }", ["Couldn't parse integer: 1.5"]),
        ('version_labels { key: "stable" value: "one" }', ['Couldn\'t parse integer: "one"']),
        (
            "model_version_policy { specific { versions: 2 } } "
            'version_labels { key: "canary" value: 2 } version_labels { key: "stable" value: 1 }',
            [
                "Request to assign label to version 2 of model elmo, which is not currently available for inference",
                'version_labels { key: "canary" value: 2 } of model elmo',
                "--allow_version_labels_for_unavailable_models",
            ],
        ),
    ],
    ids=["two-policies", "negative-num-versions", "unknown-policy", "float-version", "label-not-int", "labels"],
)
def test_config_files_stock_refuses_are_refused_naming_the_file(tmp_path, fields, needles):
    path = write_config(tmp_path, "/models/elmo", fields)
    with pytest.raises(ValueError) as info:
        parse_model_config(path)
    message = str(info.value)
    assert path in message and "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)


def test_labels_without_the_flag_are_refused_by_the_library_and_the_command_line(tmp_path):
    """The library refuses them as the config file does (`ServerCore`, stock's place), before anything loads; the
    command line with one line naming the flag and the file, exit status 2; with the flag the labels are taken."""
    labelled = ModelConfig("elmo", "/nonexistent/elmo", version_labels={"stable": 1})
    with pytest.raises(ValueError, match="^Request to assign label to version 1 of model elmo, which is not currently"):
        ModelServer({"elmo": labelled}, ServerOptions(port=0))
    config = write_config(tmp_path, "/nonexistent/elmo", 'version_labels { key: "stable" value: 1 }')
    result = forked.run(
        [sys.executable, SERVE, "--embedded", "--model_config_file", config], capture_output=True, text=True, timeout=60
    )
    lines = own_lines(result.stderr)
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    for needle in ("--model_config_file", config, "version 1 of model elmo", 'key: "stable"'):
        assert needle in lines[0], (needle, lines[0])
    assert parse_model_config(config, True)["elmo"].version_labels == {"stable": 1}


def test_the_flag_reaches_the_server_and_the_stock_server():
    """--allow_version_labels_for_unavailable_models (stock's main.cc `main`) sets the server option and is passed
    on to tensorflow_model_server."""
    import argparse

    from elmo_tf.cli.serve import DEFAULTS, build_parser, server_options, stock_command

    argv = ["--allow_version_labels_for_unavailable_models", "--model_base_path", "/m"]
    given = vars(build_parser().parse_args(argv))
    assert given["allow_version_labels_for_unavailable_models"] is True
    options = server_options(argparse.Namespace(**{**DEFAULTS, **given}), {})
    assert options.allow_version_labels_for_unavailable_models is True
    assert "--allow_version_labels_for_unavailable_models=true" in stock_command("tfs", given, [])
    assert server_options(argparse.Namespace(**DEFAULTS), {}).allow_version_labels_for_unavailable_models is False
