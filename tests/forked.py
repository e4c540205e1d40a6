"""`Popen` and `run` with subprocess's signatures for the tests' `python ...` command lines, forked from a server that
has imported TensorFlow, Keras and elmo_tf already (tests/forkserver.py): a command starts in ~0.1 s instead of ~3 s,
which is most of the suite's time on a 2-core machine (issue 37).

The child is a real process with its own pid, stdio, working directory, environment, exit status and signals, and it
runs the real script or module as `python` would (`runpy`; see tests/forkserver.py for what it reproduces of the
interpreter's start and exit). What differs from a fresh interpreter: the modules the server imported are imported
already (so their import-time output, TensorFlow's C++ log lines, is not written again), and every child shares the
server's hash seed. So a command is forked only when nothing read at import time differs: the same interpreter, and
an environment that differs from the server's only in variables read at run time (`ELMO_TF_*`, `PYTEST_*`,
`TF_CONFIG`, `PATH`, `COLUMNS`, `LINES`), in `PYTHONPATH` (the child builds its `sys.path` from it as Python does),
or in the two the tests set to quiet TensorFlow on CPU-only machines: `TF_CPP_MIN_LOG_LEVEL` (the child logs at the
server's level, 3: TensorFlow's C++ errors, such as the cuInit line of a machine without a GPU, are not written;
`cli_testlib.own_lines` leaves TensorFlow's lines out at any level) and `CUDA_VISIBLE_DEVICES`.
Anything else (TF_ENABLE_ONEDNN_OPTS, KERAS_*, a locale, HOME, a `preexec_fn` the server cannot do itself, sessions,
users) runs in a fresh interpreter by subprocess, as does every command when `ELMO_TF_TEST_FORK=0`.
A `preexec_fn` the server can do carries a `fork_request` attribute: the request fields that do the same
(`cli_testlib.limit_file_size`, `default_sigint`).

The status of a forked child comes from the server (it is the server's child, not ours): `wait`, `poll`,
`communicate` and the signals work as subprocess's; a `Popen` dropped while its child runs has its child killed.
"""

import atexit
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = Path(__file__).resolve().with_name("forkserver.py")
FORK_ENV = "ELMO_TF_TEST_FORK"
_FORKABLE_ENV = re.compile(
    r"(ELMO_TF_|PYTEST_).*|TF_CONFIG|PATH|COLUMNS|LINES|PYTHONPATH|TF_CPP_MIN_LOG_LEVEL|CUDA_VISIBLE_DEVICES"
)
_POPEN_KWARGS = {"stdin", "stdout", "stderr", "cwd", "env", "text", "universal_newlines", "encoding", "errors"}
_EXECUTE_CHILD_PARAMS = list(inspect.signature(subprocess.Popen._execute_child).parameters)[1:]
_MAX_MESSAGE = 1 << 16

_lock = threading.Lock()
_server = None


class _ForkServer:
    """The worker's fork server process: started once, ended with the worker (its stdin closes)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="elmo-tf-forkserver-")
        self.path = os.path.join(self.dir, "socket")
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        self.log = os.path.join(self.dir, "log")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER), self.path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=SERVER.parent,
            )
        self._ready = None
        atexit.register(self.close)

    def ready(self):
        """Waits for the server's imports; RuntimeError with its log when it did not start or has ended."""
        if self._ready is None:
            self._ready = self.process.stdout.readline().strip() == b"ready"
        if not self._ready or self.process.poll() is not None:
            what = f"ended with status {self.process.returncode}" if self._ready else "did not start"
            with open(self.log, errors="replace") as log:
                raise RuntimeError(f"the fork server {what}:\n{log.read()[-3000:]}")
        return self

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def start():
    """Starts the worker's fork server (once) without waiting for it; returns it, or None when forking is off."""
    global _server
    if os.environ.get(FORK_ENV) == "0":
        return None
    with _lock:
        if _server is None:
            _server = _ForkServer()
        return _server


def _forkable(args, kwargs, server):
    """Whether `python ARGS` with Popen's `kwargs` may be forked from `server` (see the module's docstring)."""
    if server is None or isinstance(args, (str, bytes)) or len(args) < 2 or os.fspath(args[0]) != sys.executable:
        return False
    first = os.fspath(args[1])
    if (first in ("-m", "-c") and len(args) < 3) or (first.startswith("-") and first not in ("-m", "-c")):
        return False
    preexec = kwargs.get("preexec_fn")
    if set(kwargs) - _POPEN_KWARGS - {"preexec_fn"} or (preexec is not None and not hasattr(preexec, "fork_request")):
        return False
    env = kwargs.get("env")
    env = os.environ if env is None else env
    differs = {k for k in set(env) | set(server.env) if env.get(k) != server.env.get(k)}
    return all(_FORKABLE_ENV.fullmatch(k) for k in differs)


class ForkedPopen(subprocess.Popen):
    """`subprocess.Popen` whose child is forked by the fork server (`Popen` decides which one a command gets)."""

    def __init__(self, args, server, **kwargs):
        preexec = kwargs.pop("preexec_fn", None)
        self._fork_request = getattr(preexec, "fork_request", {})
        self._server = server
        self._connection = None
        self._status = None
        super().__init__(args, **kwargs)

    def _execute_child(self, *positional):
        bound = dict(zip(_EXECUTE_CHILD_PARAMS, positional))
        fds = [bound["p2cread"], bound["c2pwrite"], bound["errwrite"]]
        fds = [fd if fd != -1 else default for fd, default in zip(fds, (0, 1, 2))]
        env = os.environ if bound["env"] is None else bound["env"]
        request = {
            "argv": [os.fsdecode(a) for a in bound["args"][1:]],
            "cwd": os.fsdecode(bound["cwd"]) if bound["cwd"] is not None else os.getcwd(),
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()},
            **self._fork_request,
        }
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(self._server.ready().path)
            socket.send_fds(connection, [json.dumps(request).encode()], fds)
            reply = connection.recv(_MAX_MESSAGE)
            if not reply:
                raise ChildProcessError("the fork server ended before it forked the command")
            self.pid = json.loads(reply)["pid"]
        except BaseException:
            connection.close()
            raise
        finally:
            self._close_pipe_fds(
                *(bound[k] for k in ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite"))
            )
        self._connection = connection
        self._child_created = True

    def _try_wait(self, wait_flags):
        if self._status is None:
            self._connection.setblocking(not wait_flags & os.WNOHANG)
            try:
                reply = self._connection.recv(_MAX_MESSAGE)
            except BlockingIOError:
                return (0, 0)
            if not reply:
                raise ChildProcessError(f"the fork server ended before pid {self.pid}")
            self._status = json.loads(reply)["status"]
            self._connection.close()
        return (self.pid, self._status)

    def _internal_poll(self, _deadstate=None, **_):
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def __del__(self, *args, **kwargs):
        if self._connection is not None and self.returncode is None:
            self._connection.close()  # the server kills the child
        super().__del__(*args, **kwargs)


def default_sigint():
    """A `preexec_fn`: SIGINT at its default in the child, so that Python raises KeyboardInterrupt on it even when the
    test runner ignores SIGINT (an ignored SIGINT is inherited). Every forked child starts so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


default_sigint.fork_request = {}


def Popen(args, **kwargs):  # noqa: N802 - subprocess's name
    """`subprocess.Popen(args, **kwargs)`, forked from the worker's fork server when the command allows it."""
    server = start()
    if _forkable(args, kwargs, server):
        return ForkedPopen(args, server, **kwargs)
    return subprocess.Popen(args, **kwargs)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """`subprocess.run` over `Popen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            process.kill()
            e.stdout, e.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        status = process.poll()
    if check and status:
        raise subprocess.CalledProcessError(status, process.args, stdout, stderr)
    return subprocess.CompletedProcess(process.args, status, stdout, stderr)
