"""elmo_tf.presets.download against servers that try to make it splice, never end or go elsewhere: a resume only with a
strong validator (a strong ETag or a published SHA-256), the ceiling for files of unknown size
(ELMO_TF_MAX_DOWNLOAD_BYTES), write errors, the bound on tries and time counted on net progress, redirects only to
http(s), any `requests` error as one line, and mirror files that stay inside the mirror directory."""

import errno
import hashlib
import importlib
import logging
import os
import time

import pytest
from presets_testlib import FileServer

from elmo_tf.presets.download import DownloadError, Expected, fetch, mirrored, partial_paths

DATA = os.urandom(300_000)
SHA256 = hashlib.sha256(DATA).hexdigest()
mirror_module = importlib.import_module("elmo_tf.presets.mirror")


@pytest.fixture
def server():
    with FileServer({"w.hdf5": DATA}) as s:
        yield s


def left_over(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def interrupted(server, target, expected=None, **faults):
    """A first call cut after 100,000 bytes whose resume is refused (503): what it leaves is the next call's."""
    server.faults["w.hdf5"] = {"drop_after": 100_000, "then": 503, **faults}
    with pytest.raises(DownloadError):
        fetch(server.url("w.hdf5"), target, expected, retries=0, backoff=0.01)


# -- 1. a resume only with a strong validator ------------------------------------------------------------------------


@pytest.mark.parametrize("validators", ["none", "last-modified", "weak"])
def test_a_resume_without_a_strong_validator_starts_over_and_never_splices(server, tmp_path, validators, caplog):
    """The server changes the file between two calls, keeping every validator it sends (none; the same Last-Modified
    second; the same weak ETag) and honouring a Range: a resume would splice the old head to the new tail."""
    target = tmp_path / "w.hdf5"
    interrupted(server, target, validators=validators)
    new = os.urandom(len(DATA))
    server.files["w.hdf5"] = new
    server.faults["w.hdf5"] = {"validators": validators}
    before = len(server.requests)
    with caplog.at_level(logging.WARNING, logger="elmo_tf.presets.download"):
        fetch(server.url("w.hdf5"), target, backoff=0.01)
    assert target.read_bytes() == new  # not DATA[:k] + new[k:]
    assert server.gets("w.hdf5")[before:] == [None]  # no Range without a strong validator
    assert left_over(tmp_path) == []


def test_a_strong_etag_is_sent_as_if_range_and_resumes(server, tmp_path):
    target = tmp_path / "w.hdf5"
    interrupted(server, target)
    server.faults.clear()
    fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256))
    assert target.read_bytes() == DATA and server.gets("w.hdf5")[-1].startswith("bytes=")


def test_a_published_sha256_allows_a_resume_without_validators(server, tmp_path):
    target = tmp_path / "w.hdf5"
    interrupted(server, target, Expected(sha256=SHA256), validators="none")
    assert os.path.getsize(partial_paths(target)[0]) > 0  # kept: a published SHA-256 will check the resume
    server.faults["w.hdf5"] = {"validators": "none"}
    fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256))
    assert target.read_bytes() == DATA and server.gets("w.hdf5")[-1].startswith("bytes=")
    assert left_over(tmp_path) == []


def test_a_spliced_file_under_a_published_sha256_starts_over_then_is_refused(server, tmp_path):
    target = tmp_path / "w.hdf5"
    interrupted(server, target, Expected(sha256=SHA256), validators="none")
    server.files["w.hdf5"] = os.urandom(len(DATA))  # changed upstream: no longer what the publisher's SHA-256 says
    server.faults["w.hdf5"] = {"validators": "none"}
    before = len(server.requests)
    with pytest.raises(DownloadError, match="sha256 .* expected .*nothing cached"):
        fetch(server.url("w.hdf5"), target, Expected(sha256=SHA256), backoff=0.01)
    assert server.gets("w.hdf5")[before:][0].startswith("bytes=") and server.gets("w.hdf5")[before:][-1] is None
    assert os.listdir(tmp_path) == []


# -- 2. sizes: the ceiling, lying lengths, write errors --------------------------------------------------------------


def test_an_endless_body_of_unknown_size_stops_at_the_ceiling(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", "200000")
    server.faults["w.hdf5"] = {"endless": 5_000_000}
    start = time.monotonic()
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5")
    message = str(e.value)
    assert "\n" not in message and "ELMO_TF_MAX_DOWNLOAD_BYTES" in message and "200000" in message
    assert "model 'x': weights.hdf5" in message and server.url("w.hdf5") in message
    assert os.listdir(tmp_path) == [] and len(server.requests) == 1  # refused, not retried
    assert time.monotonic() - start < 10


def test_a_file_of_unknown_size_under_the_ceiling_downloads(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", str(len(DATA)))
    server.faults["w.hdf5"] = {"no_length": True}
    fetch(server.url("w.hdf5"), tmp_path / "w.hdf5")
    assert (tmp_path / "w.hdf5").read_bytes() == DATA


def test_a_declared_length_over_the_ceiling_is_refused_before_reading(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", "100000")
    with pytest.raises(DownloadError, match=r"announces 300000 bytes, more than ELMO_TF_MAX_DOWNLOAD_BYTES=100000"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5")
    assert os.listdir(tmp_path) == [] and len(server.requests) == 1


def test_a_published_size_over_the_ceiling_is_still_downloaded(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", "1000")  # the ceiling is for files of unknown size
    fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", Expected(size=len(DATA)))
    assert (tmp_path / "w.hdf5").read_bytes() == DATA


def test_a_body_longer_than_its_content_length_is_refused(server, tmp_path):
    server.faults["w.hdf5"] = {"chunked_length": 200_000}  # chunked, so urllib3 reads past the declared length
    with pytest.raises(DownloadError, match="longer than its Content-Length of 200000"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5")
    assert os.listdir(tmp_path) == []


def test_a_body_shorter_than_its_content_length_is_never_cached(server, tmp_path):
    server.faults["w.hdf5"] = {"content_length": len(DATA) + 50_000, "drops": 0}
    target = tmp_path / "w.hdf5"
    with pytest.raises(DownloadError, match="gave up"):
        fetch(server.url("w.hdf5"), target, timeout=2, retries=1, backoff=0.01)
    assert not target.exists()  # never cached short


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", "1e9"])
def test_a_bad_ceiling_is_one_line_naming_the_variable_and_value(server, tmp_path, monkeypatch, value):
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", value)
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5")
    assert str(e.value) == f"ELMO_TF_MAX_DOWNLOAD_BYTES must be a positive integer (bytes), got {value!r}"
    assert e.value.key == "ELMO_TF_MAX_DOWNLOAD_BYTES" and server.requests == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS])
def test_a_write_error_is_one_line_and_nothing_is_cached(server, tmp_path, monkeypatch, code):
    real = os.write
    partial, _ = partial_paths(tmp_path / "w.hdf5")
    calls = []

    def failing_write(fd, data):
        if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(partial):
            calls.append(len(data))
            if len(calls) > 1:
                raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5")
    message = str(e.value)
    assert "\n" not in message and os.strerror(code) in message and "model 'x': weights.hdf5" in message
    assert "nothing cached" in message and calls
    assert os.listdir(tmp_path) == [] and len(server.requests) == 1


def test_a_write_error_of_a_mirror_copy_is_one_line(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    (mirror / "host").mkdir(parents=True)
    (mirror / "host" / "w.hdf5").write_bytes(DATA)
    out = tmp_path / "out"
    out.mkdir()

    def failing_copy(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mirror_module, "_copy_fd", failing_copy)
    with pytest.raises(DownloadError, match="No space left on device.*nothing cached"):
        fetch(mirrored("https://host/w.hdf5", str(mirror)), out / "w.hdf5")
    assert os.listdir(out) == []


# -- 3. tries and time, counted on net progress ----------------------------------------------------------------------


def test_a_server_that_makes_every_resume_start_over_ends_in_a_bounded_number_of_tries(server, tmp_path):
    """Every fresh GET is cut after 100,000 bytes; every resume comes back 206 under a new ETag, so its bytes are
    thrown away: tries bring bytes, but the final file never grows past 100,000 (404 after 40: the bound a client
    without one would reach)."""
    server.faults["w.hdf5"] = {
        "drop_fresh_after": 100_000,
        "etag_every_response": True,
        "ignore_if_range": True,
        "gone_after": 40,
    }
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", retries=2, backoff=0.001)
    assert "gave up after 3 tries in a row without the file growing" in str(e.value)
    assert len(server.requests) == 4  # fresh (+100k), resume (thrown away), fresh (0 net), resume (thrown away)


def test_tries_that_each_bring_a_little_are_bounded_in_number(server, tmp_path):
    server.faults["w.hdf5"] = {"drop_after": 10_000, "drops": 1000}
    with pytest.raises(DownloadError, match="gave up after 5 tries, the most for one file"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", backoff=0.001, max_tries=5)
    assert len(server.requests) == 5


def test_a_download_past_its_deadline_is_stopped(server, tmp_path):
    server.faults["w.hdf5"] = {"rate": 100_000}  # 3 s for the file
    start = time.monotonic()
    with pytest.raises(DownloadError, match="gave up after 0.5 s, the most for one file"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", deadline=0.5)
    assert time.monotonic() - start < 2.5


# -- 4. redirects and `requests` errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "location",
    ["file:///etc/passwd", "ftp://127.0.0.1/w.hdf5", "data:text/plain,hello", "gopher://127.0.0.1/w", "jar:x!/y"],
)
def test_a_redirect_to_another_scheme_is_one_line(server, tmp_path, location):
    server.faults["w.hdf5"] = {"location": location}
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5")
    message = str(e.value)
    assert "\n" not in message and "model 'x': weights.hdf5" in message and server.url("w.hdf5") in message
    assert location in message and "only http(s)" in message and "ELMO_TF_MIRROR" in message
    assert os.listdir(tmp_path) == []


def test_a_redirect_from_https_to_http_is_refused():
    from elmo_tf.presets.http_transfer import _next_hop

    with pytest.raises(DownloadError, match="from https to http"):
        _next_hop("https://a.example/x", "http://b.example/x", "https://a.example/x", "w")
    assert _next_hop("http://a.example/x/y", "/z?q=1", "http://a.example/x/y", "w") == "http://a.example/z?q=1"


def test_too_many_redirects_are_one_line(server, tmp_path):
    server.faults["w.hdf5"] = {"redirects": 50}
    with pytest.raises(DownloadError, match=r"more than 10 redirects.*ELMO_TF_MIRROR"):
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5")
    assert len([p for p, _ in server.requests if p == "w.hdf5"]) == 0


def test_a_redirect_to_an_invalid_url_is_one_line(server, tmp_path):
    server.faults["w.hdf5"] = {"location": "http://[::1"}
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5")
    assert "\n" not in str(e.value) and "model 'x': weights.hdf5" in str(e.value)


def test_a_closed_port_is_one_line_naming_the_url_and_what_to_do(tmp_path):
    with FileServer() as s:
        url = s.url("w.hdf5")
    with pytest.raises(DownloadError) as e:
        fetch(url, tmp_path / "w.hdf5", what="model 'x': weights.hdf5", retries=1, backoff=0.001, timeout=2)
    message = str(e.value)
    assert "\n" not in message and url in message and "model 'x': weights.hdf5" in message
    assert "ELMO_TF_MIRROR" in message and "ELMO_TF_OFFLINE" in message


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/w.hdf5", "http://", "http://[::1/w"])
def test_a_url_requests_cannot_use_is_one_line(tmp_path, url):
    with pytest.raises(DownloadError) as e:
        fetch(url, tmp_path / "w.hdf5", what="model 'x': weights.hdf5", retries=0)
    assert "\n" not in str(e.value) and "model 'x': weights.hdf5" in str(e.value)


def test_every_requests_error_is_one_line(server, tmp_path, monkeypatch):
    import requests

    def broken(*args, **kwargs):
        raise requests.exceptions.ContentDecodingError("bad\ngzip")

    session = requests.Session()
    monkeypatch.setattr(session, "get", broken)
    with pytest.raises(DownloadError) as e:
        fetch(server.url("w.hdf5"), tmp_path / "w.hdf5", what="model 'x': weights.hdf5", session=session)
    assert "\n" not in str(e.value) and "bad gzip" in str(e.value) and server.url("w.hdf5") in str(e.value)


# -- 5. the mirror directory -----------------------------------------------------------------------------------------


@pytest.fixture
def mirror(tmp_path):
    root = tmp_path / "mirror"
    (root / "host" / "models").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"not a model")
    (tmp_path / "out").mkdir()
    return root


def test_a_symlink_to_a_file_outside_the_mirror_is_refused(mirror, tmp_path):
    (mirror / "host" / "models" / "w.hdf5").symlink_to(tmp_path / "outside" / "secret")
    with pytest.raises(DownloadError, match="leaves the mirror directory"):
        fetch(mirrored("https://host/models/w.hdf5", str(mirror)), tmp_path / "out" / "w.hdf5")
    assert os.listdir(tmp_path / "out") == []


def test_a_symlinked_directory_outside_the_mirror_is_refused(mirror, tmp_path):
    (mirror / "host" / "elsewhere").symlink_to(tmp_path / "outside")
    with pytest.raises(DownloadError, match="leaves the mirror directory"):
        fetch(mirrored("https://host/elsewhere/secret", str(mirror)), tmp_path / "out" / "w.hdf5")
    assert os.listdir(tmp_path / "out") == []


def test_a_symlink_inside_the_mirror_is_followed(mirror, tmp_path):
    (mirror / "host" / "models" / "real.hdf5").write_bytes(DATA)
    (mirror / "host" / "models" / "w.hdf5").symlink_to("real.hdf5")
    fetch(mirrored("https://host/models/w.hdf5", str(mirror)), tmp_path / "out" / "w.hdf5", Expected(sha256=SHA256))
    assert (tmp_path / "out" / "w.hdf5").read_bytes() == DATA


def test_a_mirror_that_is_itself_a_symlink_works(mirror, tmp_path):
    (mirror / "host" / "models" / "w.hdf5").write_bytes(DATA)
    (tmp_path / "link").symlink_to(mirror)
    fetch(mirrored("https://host/models/w.hdf5", str(tmp_path / "link")), tmp_path / "out" / "w.hdf5")
    assert (tmp_path / "out" / "w.hdf5").read_bytes() == DATA


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_a_mirror_entry_that_is_not_a_regular_file_is_refused(mirror, tmp_path, kind):
    path = mirror / "host" / "models" / "w.hdf5"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(DownloadError) as e:
        fetch(mirrored("https://host/models/w.hdf5", str(mirror)), tmp_path / "out" / "w.hdf5")
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert os.listdir(tmp_path / "out") == []


def test_a_mirror_file_of_unknown_size_over_the_ceiling_is_refused(mirror, tmp_path, monkeypatch):
    (mirror / "host" / "models" / "w.hdf5").write_bytes(DATA)
    monkeypatch.setenv("ELMO_TF_MAX_DOWNLOAD_BYTES", "1000")
    with pytest.raises(DownloadError, match="ELMO_TF_MAX_DOWNLOAD_BYTES=1000"):
        fetch(mirrored("https://host/models/w.hdf5", str(mirror)), tmp_path / "out" / "w.hdf5")
    assert os.listdir(tmp_path / "out") == []
