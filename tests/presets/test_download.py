"""elmo_tf.presets.download against a real HTTP server on 127.0.0.1 with faults injected (tests/presets_testlib.py):
resume after a dropped connection, a server without ranges, 4xx and 5xx, redirects, a stall, wrong sizes and
checksums, a file changed upstream, kill -9 mid-download, the mirror."""

import hashlib
import logging
import os
import signal
import subprocess
import sys

import pytest
from presets_testlib import FileServer, wait_for

from elmo_tf.presets.download import DownloadError, Expected, fetch, mirrored, partial_paths

DATA = os.urandom(300_000)
SHA256 = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def server():
    with FileServer({"w.hdf5": DATA}) as s:
        yield s


def left_over(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def test_downloads_verifies_and_leaves_nothing_else(server, tmp_path):
    target = tmp_path / "w.hdf5"
    record = fetch(server.url("w.hdf5"), target, Expected(size=len(DATA), sha256=SHA256))
    assert target.read_bytes() == DATA
    assert record["sha256"] == SHA256 and record["size"] == len(DATA) and record["etag"] == server.etag("w.hdf5")
    assert left_over(tmp_path) == []
    assert server.gets("w.hdf5") == [None]


def test_a_connection_dropped_half_way_is_resumed_with_a_range(server, tmp_path, caplog):
    server.faults["w.hdf5"] = {"drop_after": 120_000}
    target = tmp_path / "w.hdf5"
    fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256), backoff=0.01)
    assert target.read_bytes() == DATA
    ranges = server.gets("w.hdf5")
    assert ranges[0] is None and len(ranges) == 2
    assert int(ranges[1].split("=")[1].rstrip("-")) >= 65_536  # resumed from what had arrived, not from 0
    assert left_over(tmp_path) == []


def test_a_server_that_ignores_range_starts_over_with_a_warning(server, tmp_path, caplog):
    server.faults["w.hdf5"] = {"drop_after": 120_000, "ignore_range": True}
    target = tmp_path / "w.hdf5"
    with caplog.at_level(logging.WARNING, logger="elmo_tf.presets.download"):
        fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256), backoff=0.01)
    assert target.read_bytes() == DATA
    assert "sent the whole file instead of resuming" in caplog.text


@pytest.mark.parametrize("status", [404, 403])
def test_4xx_is_one_line_naming_the_url_and_what_to_do(server, tmp_path, status):
    server.faults["w.hdf5"] = {"statuses": [status]}
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5")
    message = str(e.value)
    assert "\n" not in message and server.url("w.hdf5") in message and f"HTTP {status}" in message
    assert "model 'x': weights.hdf5" in message and "new link" in message
    assert os.listdir(tmp_path) == [] and len(server.requests) == 1  # a 4xx is not retried


def test_500_twice_then_200_is_retried_with_backoff(server, tmp_path):
    server.faults["w.hdf5"] = {"statuses": [500, 503]}
    fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", Expected(sha256=SHA256), backoff=0.01)
    assert (tmp_path / "w.hdf5").read_bytes() == DATA and len(server.requests) == 3


def test_5xx_beyond_the_retries_gives_up(server, tmp_path):
    server.faults["w.hdf5"] = {"statuses": [500] * 10}
    with pytest.raises(DownloadError, match="gave up after 3 tries in a row"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", retries=2, backoff=0.01)
    assert len(server.requests) == 3 and os.listdir(tmp_path) == []


def test_a_redirect_chain_is_followed(server, tmp_path):
    server.faults["w.hdf5"] = {"redirects": 4}
    fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", Expected(size=len(DATA), sha256=SHA256))
    assert (tmp_path / "w.hdf5").read_bytes() == DATA


def test_a_stalled_server_times_out_and_the_next_call_resumes(server, tmp_path):
    server.faults["w.hdf5"] = {"stall_after": 100_000, "then": 503}
    target = tmp_path / "w.hdf5"
    with pytest.raises(DownloadError, match="gave up after 2 tries"):
        fetch(server.url("w.hdf5"), target, timeout=0.3, retries=1, backoff=0.01)
    partial, state = partial_paths(target)
    done = os.path.getsize(partial)
    assert not target.exists() and 0 < done <= 100_000  # what arrived is kept for the next call, never used
    server.faults.clear()
    fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256))
    assert target.read_bytes() == DATA and server.gets("w.hdf5")[-1] == f"bytes={done}-"
    assert left_over(tmp_path) == []


@pytest.mark.parametrize(
    "expected, match",
    [
        (Expected(size=len(DATA) + 1), "the server announces 300000 bytes, expected 300001"),
        (Expected(sha256="0" * 64), "sha256 .* expected 0000"),
        (Expected(md5="0" * 32), "md5 .* expected 0000"),
    ],
)
def test_a_wrong_size_or_checksum_is_refused_and_nothing_is_cached(server, tmp_path, expected, match):
    target = tmp_path / "w.hdf5"
    with pytest.raises(DownloadError, match=match):
        fetch(server.url("w.hdf5"), target, expected)
    assert os.listdir(tmp_path) == []


def test_a_body_longer_than_the_published_size_is_refused(server, tmp_path):
    server.files["w.hdf5"] = DATA + b"x" * 10
    with pytest.raises(DownloadError, match="announces 300010 bytes, expected 300000"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", Expected(size=len(DATA)))
    assert os.listdir(tmp_path) == []


def test_a_file_changed_upstream_starts_over(server, tmp_path, caplog):
    server.faults["w.hdf5"] = {"drop_after": 100_000, "then": 503}
    target = tmp_path / "w.hdf5"
    with pytest.raises(DownloadError):
        fetch(server.url("w.hdf5"), target, retries=0)
    server.faults.clear()
    new = os.urandom(200_000)
    server.files["w.hdf5"] = new  # new bytes, new ETag: If-Range no longer matches, the server sends the whole file
    with caplog.at_level(logging.WARNING, logger="elmo_tf.presets.download"):
        fetch(server.url("w.hdf5"), target)
    assert target.read_bytes() == new
    assert "starting over" in caplog.text


def test_a_206_under_another_etag_starts_over(server, tmp_path, caplog):
    server.faults["w.hdf5"] = {"drop_after": 100_000, "then": 503}
    target = tmp_path / "w.hdf5"
    with pytest.raises(DownloadError):
        fetch(server.url("w.hdf5"), target, retries=0)
    server.faults["w.hdf5"] = {"ignore_if_range": True}
    new = os.urandom(len(DATA))
    server.files["w.hdf5"] = new  # a CDN that honours the Range without checking If-Range: the ETag of the 206 tells
    with caplog.at_level(logging.WARNING, logger="elmo_tf.presets.download"):
        fetch(server.url("w.hdf5"), target, backoff=0.01)
    assert target.read_bytes() == new
    assert "changed upstream (ETag or range differs)" in caplog.text


KILLED = """
import sys
from elmo_tf.presets.download import fetch
fetch(sys.argv[1], sys.argv[2])
"""


def test_kill_9_mid_download_leaves_no_file_and_the_next_call_resumes(server, tmp_path):
    server.faults["w.hdf5"] = {"rate": 100_000}
    target = tmp_path / "w.hdf5"
    partial, _ = partial_paths(target)
    child = subprocess.Popen([sys.executable, "-c", KILLED, server.url("w.hdf5"), str(target)])
    try:
        assert wait_for(lambda: os.path.exists(partial) and os.path.getsize(partial) >= 60_000, timeout=60)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert not target.exists()
    done = os.path.getsize(partial)
    server.faults.clear()
    fetch(server.url("w.hdf5"), target, Expected(size=len(DATA), sha256=SHA256))
    assert target.read_bytes() == DATA
    assert server.gets("w.hdf5")[-1] == f"bytes={done}-"


def test_a_mirror_directory_or_url_replaces_the_origin(server, tmp_path):
    origin = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/w.hdf5"
    mirror = tmp_path / "mirror"
    (mirror / "s3-us-west-2.amazonaws.com/allennlp/models/elmo").mkdir(parents=True)
    (mirror / "s3-us-west-2.amazonaws.com/allennlp/models/elmo/w.hdf5").write_bytes(DATA)
    out = tmp_path / "out"
    out.mkdir()
    fetch(mirrored(origin, str(mirror)), out / "a.hdf5", Expected(sha256=SHA256))
    assert (out / "a.hdf5").read_bytes() == DATA
    with pytest.raises(DownloadError, match="sha256"):
        fetch(mirrored(origin, str(mirror)), out / "b.hdf5", Expected(sha256="1" * 64))
    assert sorted(os.listdir(out)) == ["a.hdf5"]
    server.files["s3-us-west-2.amazonaws.com/allennlp/models/elmo/w.hdf5"] = DATA
    assert mirrored(origin, server.url("")) == server.url("s3-us-west-2.amazonaws.com/allennlp/models/elmo/w.hdf5")
    fetch(mirrored(origin, server.url("")), out / "c.hdf5", Expected(sha256=SHA256))
    assert (out / "c.hdf5").read_bytes() == DATA
    with pytest.raises(DownloadError, match="leaves the mirror directory"):
        mirrored("https://host/../../etc/passwd", str(mirror))
