"""tests/forked.py, the fork server the suite's command lines run on: a forked command behaves as the same command in a
fresh interpreter (status, output, input, working directory, environment, signals, exit handlers, file size limit),
and what it cannot reproduce runs in a fresh interpreter."""

import os
import signal
import subprocess
import sys
import time

import forked
import pytest
from cli_testlib import limit_file_size


def both(code, *args, **kwargs):
    """`python -c code args` forked and fresh: (forked result, fresh result), text, output captured."""
    argv = [sys.executable, "-c", code, *args]
    options = dict(capture_output=True, text=True, timeout=60, **kwargs)
    return forked.run(argv, **options), subprocess.run(argv, **options)


def parent_of(result):
    return int(result.stdout.split()[-1])


def test_a_command_is_forked_from_the_server_unless_told_otherwise():
    ours, fresh = both("import os; print(os.getppid())")
    server = forked.start()
    assert parent_of(ours) == server.process.pid and parent_of(fresh) == os.getpid()
    onednn = forked.run(
        [sys.executable, "-c", "import os; print(os.getppid())"],
        env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0"),  # read when TensorFlow is imported: a fresh interpreter
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert parent_of(onednn) == os.getpid()


@pytest.mark.parametrize(
    "code, status",
    [
        ("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", 3),
        ("import sys; sys.exit('a message')", 1),
        ("import sys; sys.exit(256 + 7)", 7),
        ("raise ValueError('boom')", 1),
        ("print('fine')", 0),
    ],
)
def test_status_and_output_are_a_fresh_interpreters(code, status):
    ours, fresh = both(code)
    assert ours.returncode == fresh.returncode == status
    assert ours.stdout == fresh.stdout
    assert [line for line in ours.stderr.splitlines() if "File" not in line] == [
        line for line in fresh.stderr.splitlines() if "File" not in line
    ]


def test_input_directory_environment_and_path(tmp_path):
    code = (
        "import os, sys; print(sys.stdin.read().upper(), os.getcwd(), os.environ['ELMO_TF_X'], sys.path[1], sys.argv)"
    )
    env = dict(os.environ, ELMO_TF_X="42", PYTHONPATH=str(tmp_path / "lib"))
    ours, fresh = both(code, "a", "b", input="abc", cwd=tmp_path, env=env)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == fresh.stdout == f"ABC {tmp_path} 42 {tmp_path / 'lib'} ['-c', 'a', 'b']\n"


def test_exit_handlers_and_threads_run_before_the_status():
    code = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "sys.exit(5)\n"
    )
    ours, fresh = both(code)
    assert ours.returncode == fresh.returncode == 5
    assert ours.stdout == fresh.stdout == "thread\natexit\n"


def test_a_file_size_limit_fails_writes_with_efbig(tmp_path):
    code = (
        "import sys\ntry:\n    with open(sys.argv[1], 'wb') as f:\n        f.write(b'x' * 5000)\n"
        "except OSError as e:\n    print(e.errno)"
    )
    ours, fresh = both(code, str(tmp_path / "big"), preexec_fn=limit_file_size(1000))
    assert ours.stdout == fresh.stdout == "27\n"  # EFBIG


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_signals_end_it_as_they_end_python(sig):
    code = "import sys, time; print('ready', flush=True); time.sleep(60)"
    process = forked.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=forked.default_sigint
    )
    assert process.stdout.readline() == b"ready\n"
    process.send_signal(sig)
    assert process.wait(30) == -sig  # Python ends an uncaught KeyboardInterrupt by SIGINT
    if sig == signal.SIGINT:
        assert b"KeyboardInterrupt" in process.stderr.read()
    process.stdout.close()
    process.stderr.close()


def test_a_timeout_kills_the_child_and_a_dropped_popen_too():
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    process = forked.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pid = process.pid
    del process
    for _ in range(300):  # the server kills it when our end of its connection closes; bounded wait
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"pid {pid} still runs")
    # and the server goes on (it once ended here: the killed child's end unregistered its connection twice)
    after = forked.run([sys.executable, "-c", "print('still here')"], capture_output=True, text=True, timeout=60)
    assert after.stdout == "still here\n" and forked.start().process.poll() is None
