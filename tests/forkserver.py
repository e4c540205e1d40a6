"""The fork server behind `forked.Popen`: one process per test worker that imports TensorFlow, Keras and elmo_tf once,
then forks a child for each command line the tests run (`python SCRIPT ARGS`, `python -m MODULE ARGS`, `python -c
CODE ARGS`). A child starts in ~0.1 s instead of the ~3 s a fresh interpreter spends importing TensorFlow.

    python tests/forkserver.py SOCKET

It prints "ready" on stdout once the imports are done and it listens on the Unix socket SOCKET (SOCK_SEQPACKET).
A request is one JSON message `{"argv", "cwd", "env", "file_size"}` carrying the child's stdin, stdout and stderr as
file descriptors (SCM_RIGHTS); the answer is `{"pid": N}` once it is forked, then `{"status": S}` (the raw wait
status) once it has ended. A client that closes its connection first gets its child killed (SIGKILL). The server ends,
killing its children, when its stdin reaches EOF (the test worker is gone).

The child does what a fresh interpreter does around the program: its own stdio over the given descriptors (line
buffered on a terminal), `sys.argv` and `sys.path[0]` as Python sets them, SIGINT raising KeyboardInterrupt, the
file size limit (`file_size`, RLIMIT_FSIZE with SIGXFSZ ignored, as `cli_testlib.limit_file_size`); after the program:
an uncaught exception through `sys.excepthook`, then the non-daemon threads joined, the `atexit` functions, stdio
flushed, and the exit status Python would give (an uncaught KeyboardInterrupt ends it by SIGINT, as Python does).
"""

import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback

PRELOAD = (
    "numpy",
    "tensorflow",
    "keras",
    "elmo_tf",
    "elmo_tf.cli.main",
    "elmo_tf.models",
    "elmo_tf.pretraining",
    "elmo_tf.embed",
    "elmo_tf.saved_model.export",
    "elmo_tf.embed.score",
    "elmo_tf.ner",
    "elmo_tf.convert",
)
MAX_MESSAGE = 1 << 20


def _stdio():
    """Fresh `sys.stdin/stdout/stderr` over fds 0-2, as the interpreter makes them at start-up."""
    encoding = sys.stdout.encoding
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding=encoding)
    for name, fd, errors in (("stdout", 1, sys.stdout.errors), ("stderr", 2, "backslashreplace")):
        raw = open(fd, "wb", buffering=0, closefd=False)
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding=encoding, errors=errors, line_buffering=raw.isatty() or name == "stderr"
        )
        setattr(sys, name, stream)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _sys_path(first, python_path, server_python_path):
    """`sys.path` as `python` builds it under `PYTHONPATH=python_path`: `first`, the PYTHONPATH entries, then the rest
    of the server's (its own PYTHONPATH entries left out)."""
    rest = sys.path[1:]
    for entry in (server_python_path or "").split(os.pathsep):
        if entry and os.path.abspath(entry) in rest:
            rest.remove(os.path.abspath(entry))
    ours = [os.path.abspath(e) for e in (python_path or "").split(os.pathsep) if e]
    return [first, *ours, *rest]


def _program(argv):
    """`(sys.argv, sys.path[0], run)` for `python ARGS...` (`argv` without the interpreter)."""
    if argv[0] == "-m":
        return ["-m", *argv[2:]], os.getcwd(), lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    if argv[0] == "-c":
        code = argv[1]
        return ["-c", *argv[2:]], "", lambda: exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    script = argv[0]
    return list(argv), os.path.dirname(os.path.abspath(script)), lambda: runpy.run_path(script, run_name="__main__")


def _program_frames(traceback):
    """`traceback` without the server's frames and runpy's before the program's own, as Python prints it."""
    while traceback is not None and traceback.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
        traceback = traceback.tb_next
    return traceback


def _exit_code(code):
    """The exit status `sys.exit(code)` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request, fds):
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    server_python_path = os.environ.get("PYTHONPATH")
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request.get("file_size") is not None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_size"], request["file_size"]))
    _stdio()
    sys.argv, first, run = _program(request["argv"])
    sys.path[:] = _sys_path(first, os.environ.get("PYTHONPATH"), server_python_path)
    interrupted = False
    try:
        run()
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt as e:
        sys.excepthook(type(e), e, e.with_traceback(_program_frames(e.__traceback__)).__traceback__)
        code, interrupted = 1, True
    except BaseException as e:
        sys.excepthook(type(e), e, e.with_traceback(_program_frames(e.__traceback__)).__traceback__)
        code = 1
    try:
        threading._shutdown()
    except BaseException:
        pass
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = 120 if stream is sys.stdout else code  # Python's status when stdout cannot be flushed at exit
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


class _Server:
    def __init__(self, path):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.selector.register(sys.stdin, selectors.EVENT_READ, ("parent", None))
        self.children = {}  # pid -> (pidfd, connection)

    def serve(self):
        while True:
            for key, _ in self.selector.select():
                kind, item = key.data
                if kind == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self.close()
                        return
                    continue
                try:
                    if kind == "accept":
                        self._accept()
                    elif kind == "ended":
                        self._ended(item)
                    elif kind == "client":
                        self._client_gone(item, key.fileobj)
                except Exception:  # one request's trouble never ends the server; its log has it
                    traceback.print_exc()

    def _accept(self):
        connection, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 3)
        if len(fds) != 3 or not message:
            for fd in fds:
                os.close(fd)
            connection.close()
            return
        pid = os.fork()
        if pid == 0:
            try:
                self.selector.close()
                self.listener.close()
                connection.close()
                for pidfd, other in self.children.values():
                    os.close(pidfd)
                    other.close()
                _child(json.loads(message), fds)
            finally:
                os._exit(255)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (pidfd, connection)
        self.selector.register(pidfd, selectors.EVENT_READ, ("ended", pid))
        self.selector.register(connection, selectors.EVENT_READ, ("client", pid))
        connection.send(json.dumps({"pid": pid}).encode())

    def _ended(self, pid):
        pidfd, connection = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        if connection.fileno() in self.selector.get_map():  # not when its client left first (`_client_gone`)
            self.selector.unregister(connection)
        try:
            connection.send(json.dumps({"status": status}).encode())
        except OSError:
            pass
        connection.close()

    def _client_gone(self, pid, connection):
        try:
            data = connection.recv(16)
        except OSError:
            data = b""
        if not data and pid in self.children:
            self.selector.unregister(connection)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self):
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in list(self.children):
            os.waitpid(pid, 0)


def main(path):
    for name in PRELOAD:
        importlib.import_module(name)
    server = _Server(path)
    print("ready", flush=True)
    server.serve()


if __name__ == "__main__":
    main(sys.argv[1])
