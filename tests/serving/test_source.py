"""elmo_tf/serving/source.py with a real embedded server on 127.0.0.1 (issue 12, items 5 and 6): version directory
names read as TF Serving reads them (int64, leading zeros), names that are not versions ignored and logged once, and
versions gone from disk forgotten. After each case a valid request is served within a few seconds, and the growth of
the server's resident memory is bounded (printed; `pytest -s` shows it).
"""

import logging
import os
import shutil
import time

from serving_testlib import (
    VALID,
    assert_serves,
    copy_version,
    messages,
    report,
    rss_mib,
    start_server,
    statuses,
    wait_for,
)

from elmo_tf.serving.client import ElmoClient

INT64_MAX = str(2**63 - 1)


def test_version_names_that_are_not_int64_are_ignored_and_gone_versions_forgotten(fresh_base, expected, caplog):
    """Item 5: "99999999999999999999" (above int64) beside version 1 made every Predict and GetModelStatus INTERNAL.
    Now it, 2**63 (the first overflow), a non-ASCII digit, "1e3" and "-2" are ignored with one log line each over
    many polls, while 2**63 - 1 is a version; when that version's directory goes, its state goes too."""
    caplog.set_level(logging.WARNING, logger="elmo_tf.serving")
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.05)
    try:
        assert_serves(server, expected)
        before = rss_mib()
        for name in ("99999999999999999999", str(2**63), "\u0663", "1e3", "-2"):
            copy_version(fresh_base, "1", name)  # complete SavedModels: only their names are wrong
        time.sleep(1.0)  # about 20 polls
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            for _ in range(10):
                assert c.model_status() == [
                    {"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}
                ]
                assert c.embed(VALID).model_version == 1
        overflow = messages(caplog, "'99999999999999999999'")
        assert len(overflow) == 1 and "a number above 2**63 - 1" in overflow[0], overflow
        assert len(messages(caplog, f"'{2**63}'")) == 1
        assert len(messages(caplog, "'1e3'")) == 1 and "not a version number" in messages(caplog, "'1e3'")[0]

        copy_version(fresh_base, "1", INT64_MAX)  # the largest version number there is
        wait_for(lambda: server.core.managers["elmo"].served_version == 2**63 - 1, 30, "version 2**63 - 1 served")
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            assert c.embed(VALID, version=2**63 - 1).model_version == 2**63 - 1
            wait_for(lambda: statuses(c) == [(2**63 - 1, "AVAILABLE"), (1, "END")], 10, "version 1 END")
            shutil.rmtree(os.path.join(fresh_base, INT64_MAX))  # gone from disk: version 1 comes back
            wait_for(lambda: statuses(c) == [(1, "AVAILABLE")], 30, "version 1 alone, 2**63 - 1 forgotten")
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    report("item 5: overflowing names, int64 max version loaded and removed", before, after, served)
    assert after - before < 300  # two more loads of the small model; the bug grew nothing but failed every request


def test_zero_padded_version_directory_is_its_number(fresh_base, expected, caplog):
    """Item 6: "007" never loaded. It is version 7; "07" beside it names the same version (TF Serving reads the name
    that sorts last, "07"), logged once and not reloaded."""
    caplog.set_level(logging.WARNING, logger="elmo_tf.serving")
    server = start_server(fresh_base, rest_api_port=None, file_system_poll_wait_seconds=0.05)
    manager = server.core.managers["elmo"]
    try:
        assert_serves(server, expected)
        before = rss_mib()
        copy_version(fresh_base, "1", "007")
        wait_for(lambda: manager.served_version == 7, 30, "version 7 served from '007'")
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            assert c.embed(VALID, version=7).model_version == 7
            wait_for(lambda: statuses(c) == [(7, "AVAILABLE"), (1, "END")], 10, "version 1 END")
            with manager.acquire() as served_before:
                pass
            copy_version(fresh_base, "1", "07")
            time.sleep(0.5)  # about 10 polls
            with manager.acquire() as served_after:
                assert served_after is served_before  # the same version: not loaded again
            assert statuses(c) == [(7, "AVAILABLE"), (1, "END")]
        assert len(messages(caplog, "'007'")) == 1 and "version 7 is read from '07'" in messages(caplog, "'007'")[0]
        served = assert_serves(server, expected, version=7)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    report("item 6: '007' is version 7", before, after, served)
    assert after - before < 200
