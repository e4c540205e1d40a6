"""elmo_tf/io/atomic.py on a disk that refuses writes: `WriteError` naming the target, the temporary removed, the old
file kept, and HDF5 kept from ever seeing the failed write (no "Exception ignored" storm, no crash at close).

The refusal is real: a file-size limit (RLIMIT_FSIZE, soft limit only, with SIGXFSZ ignored, as Python does at start)
makes a write past it fail with EFBIG, as a full disk fails one with ENOSPC. It is set around the write only.
"""

import errno
import os

import h5py
import numpy as np
import pytest
from cli_testlib import file_size_limit

from elmo_tf.io.atomic import HDF5Sink, WriteError, atomic_hdf5, stdout_write_error, write_error, write_text

LIMIT = 64 * 1024
OLD = b"the previous output, which must survive\n"


def arrays(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, 17, 16)).astype(np.float32) for _ in range(n)]  # 3,264 bytes each


def leftovers(directory):
    return sorted(name for name in os.listdir(directory) if ".tmp-" in name)


def test_an_hdf5_file_written_through_the_sink_reads_back_exactly(tmp_path):
    data = arrays(40)
    with atomic_hdf5(tmp_path / "out.hdf5") as f:
        for k, array in enumerate(data):
            f.create_dataset(str(k), data=array)
        f.attrs["note"] = "x"
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert sorted(f, key=int) == [str(k) for k in range(40)] and f.attrs["note"] == "x"
        for k, array in enumerate(data):
            np.testing.assert_array_equal(f[str(k)][...], array)
    assert leftovers(tmp_path) == []


def test_a_refused_hdf5_write_raises_once_and_keeps_the_old_file(tmp_path, capfd):
    target = tmp_path / "out.hdf5"
    target.write_bytes(OLD)
    with pytest.raises(WriteError) as caught, file_size_limit(LIMIT):
        with atomic_hdf5(target) as f:
            for k, array in enumerate(arrays(100)):  # 326 kB: past the limit after about 20 datasets
                f.create_dataset(str(k), data=array)
    assert caught.value.errno == errno.EFBIG and caught.value.filename == str(target)
    assert str(caught.value) == f"cannot write {str(target)!r}: File too large"
    assert target.read_bytes() == OLD and leftovers(tmp_path) == []
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err[:2000]


def test_hdf5_goes_on_working_after_the_failure_until_the_writer_stops(tmp_path, capfd):
    """What HDF5 wrote after the refusal is kept in memory: it reads back every dataset, so it never errs (in a
    destructor, where nobody could catch it) before the writer calls `check()`."""
    data = arrays(60)
    with file_size_limit(LIMIT):
        sink = HDF5Sink(tmp_path / "tmp.hdf5", target=tmp_path / "out.hdf5")
        with h5py.File(sink, "w") as f:
            for k, array in enumerate(data):
                f.create_dataset(str(k), data=array)
            assert sink.error is not None and sink.error.errno == errno.EFBIG
            assert os.path.getsize(tmp_path / "tmp.hdf5") <= LIMIT
            for k, array in enumerate(data):
                np.testing.assert_array_equal(f[str(k)][...], array)
        sink.close()
    with pytest.raises(WriteError, match="out.hdf5.*File too large"):
        sink.check()
    assert "Exception ignored" not in capfd.readouterr().err


def test_write_text_under_a_limit_names_the_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "vocab.txt"
    target.write_bytes(OLD)
    with pytest.raises(WriteError) as caught, file_size_limit(LIMIT):
        write_text(target, "word\n" * LIMIT)
    assert caught.value.errno == errno.EFBIG and caught.value.filename == str(target)
    assert target.read_bytes() == OLD and leftovers(tmp_path) == []
    write_text(target, "fits\n")
    assert target.read_text() == "fits\n"


@pytest.mark.parametrize(
    "error, code",
    [
        (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
        (RuntimeError("x/ckpt-2_temp/part-0.tempstate1; No space left on device [Op:SaveV2]"), errno.ENOSPC),
        (RuntimeError("run/checkpoints/ckpt-2_temp/part-0.data; File too large [Op:SaveV2]"), errno.EFBIG),
        (RuntimeError("shapes differ"), None),
    ],
)
def test_write_error_reads_the_os_error_from_tensorflow_messages(error, code):
    result = write_error("run/checkpoints/ckpt-2", error)
    if code is None:
        assert result is None
    else:
        assert isinstance(result, WriteError) and result.errno == code
        assert str(result) == f"cannot write 'run/checkpoints/ckpt-2': {os.strerror(code)}"


def test_stdout_write_error_names_the_file_and_silences_the_final_flush(tmp_path, monkeypatch):
    out = open(tmp_path / "tagged.txt", "w")
    monkeypatch.setattr("sys.stdout", out)
    saved = os.dup(out.fileno())
    try:
        error = stdout_write_error(OSError(errno.ENOSPC, "No space left on device"))
        out.write("still buffered\n")
        out.flush()  # goes to /dev/null now
    finally:
        os.dup2(saved, out.fileno())
        os.close(saved)
        out.close()
    assert str(error) == f"cannot write {str(tmp_path / 'tagged.txt')!r}: No space left on device"
    assert (tmp_path / "tagged.txt").read_text() == ""
