"""Notebook kernels forked from one process that has already imported torch, for the test runs only.

Every notebook under nbval gets its own new kernel, and every new kernel used to spend about 3.5 s of a core
importing the same modules (torch, numpy, IPython, ipykernel, matplotlib) before its first cell ran, and about 4 s
more for torch's compiler where it compiles. In a test run (``POSENC_RUN_DIR`` set, tests/plugin.py),
nbval's kernel command is this file instead of ``python -m ipykernel_launcher``:

- the **shim** (``kernel_fork.py -f <connection file>``, what jupyter_client starts and manages) asks the run's
  **fork server** for a kernel: it sends its working directory, environment and arguments, and its standard
  streams, over a Unix socket in the run's directory. The server forks; the child takes the shim's streams,
  directory, environment (``os.environ`` replaced) and arguments, and runs ``ipykernel_launcher`` as
  ``python -m`` would. The kernel is a new process with the notebook's own namespace: only the imported modules
  are shared, as if it had imported them itself (torch's random state too: nothing ran in the server).
- The shim stays the process jupyter_client knows: it forwards interrupts and termination to the kernel, and
  exits with it; if the shim is killed, the kernel sees its connection close and exits.
- The fork server is started by the first shim of a run (under a lock), imports the modules once, and exits when
  the run's directory is removed. Anything unexpected (no run directory, no server, no answer) and the shim runs
  ``ipykernel_launcher`` itself: a fresh kernel, as without this file.

Linux only (elsewhere every kernel is started afresh). ``POSENC_FRESH_KERNELS=1`` turns the server off
(``make test-portable`` runs every notebook in fresh kernels, and ``make notebooks`` stores outputs from fresh
kernels, so the stored outputs are checked both ways).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

SOCKET_NAME = "kernels.sock"
#: What the chapters import, imported once by the server.
PRELOAD = (
    "numpy",
    "torch",
    "IPython",
    "ipykernel.kernelapp",
    "ipykernel_launcher",
    "matplotlib",
    # 0.3-0.45 s a kernel; importing pyplot loads no backend, so the inline backend still hooks into the kernel's
    # IPython at its first figure (tests/notebooks/test_kernel_fork.py displays one)
    "matplotlib.pyplot",
    # torch's compiler stack, about 4 s of a core to import, which every chapter that compiles paid at its first
    # torch.compile (07's first compiled cell: 3.1 s with its own import, 0.75 s forked; the server's start: 4 s
    # before, 7 s after). The settings these read from the environment at import are the run's (every kernel of
    # a run has the run's environment); those read from the working directory are re-derived in each kernel
    # (_settings_of_this_directory). tests/notebooks/test_kernel_fork.py compares them all with a fresh interpreter's.
    "torch._dynamo",
    "torch._inductor.compile_fx",
)
#: matplotlib reads its backend from the environment when imported; ipykernel sets this same value before the
#: kernel's first cell (``IPKernelApp.init_gui_pylab``), so the server sets it before importing matplotlib.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def _fresh_kernel(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


#: This file: nbval's kernel command in a test run (tests/plugin.py), the shim.
SHIM = os.path.abspath(__file__)


def enabled() -> bool:
    """Kernels are forked: on Linux unless ``POSENC_FRESH_KERNELS=1`` (forking a process that has loaded macOS's
    system frameworks is not safe)."""
    return sys.platform == "linux" and os.environ.get("POSENC_FRESH_KERNELS") != "1"


def _socket_path() -> str | None:
    """The run's fork-server socket, or None for a fresh kernel: outside a test run, or not :func:`enabled`."""
    run_dir = os.environ.get("POSENC_RUN_DIR")
    if not run_dir or not enabled():
        return None
    return os.path.join(run_dir, SOCKET_NAME) if os.path.isdir(run_dir) else None


def _connect(path: str, timeout: float) -> socket.socket | None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path + ".failed"):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(path)
            return client
        except OSError:
            client.close()
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    return None


def _server_connection(path: str) -> socket.socket | None:
    """A connection to the run's fork server, started first (once per run, under a lock) if it is not running."""
    client = _connect(path, 0.0) if os.path.exists(path) else None
    if client is not None:
        return client
    import fcntl

    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = path + ".started"
        if not os.path.exists(started):
            open(started, "w").close()
            subprocess.Popen(
                [sys.executable, SHIM, "--serve", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
    return _connect(path, 30.0)


def shim(argv: list[str]) -> None:
    path = _socket_path()
    client = _server_connection(path) if path else None
    if client is None:
        _fresh_kernel(argv)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        socket.send_fds(client, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = client.recv(64)
            if not chunk:
                break
            answer += chunk
        pid = int(answer)
    except (OSError, ValueError):
        client.close()
        _fresh_kernel(argv)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    # the kernel holds the other end: it is closed when the kernel exits
    while True:
        try:
            if not client.recv(64):
                break
        except InterruptedError:
            continue
    sys.exit(0)


def _kernel(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the kernel the shim asked for (never returns)."""
    import runpy
    import threading

    try:
        os.setsid()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        _settings_of_this_directory()

        def watch() -> None:  # the shim gone (killed): the kernel goes too
            while connection.recv(64):
                pass
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _settings_of_this_directory() -> None:
    """Re-derive, in the forked kernel, the preloaded settings that torch computes from the working directory at
    import: those of the server's directory otherwise (tests/notebooks/test_kernel_fork.py compares every setting with a
    fresh interpreter's)."""
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        dynamo.debug_dir_root = dynamo.default_debug_dir_root()
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:  # torch/_inductor/config.py, class xpu
        inductor.xpu.cutlass_dir = os.path.realpath(
            os.environ.get("TORCHINDUCTOR_CUTLASS_DIR", "")
        )


def serve(path: str) -> None:
    """The run's fork server: import once, then fork a kernel per connection until the run's directory goes."""
    import importlib

    try:
        os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:
        open(path + ".failed", "w").close()  # the shims start fresh kernels
        raise
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the system
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    run_dir = os.path.dirname(path)
    while os.path.isdir(run_dir):
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        connection.settimeout(10.0)
        try:
            data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            while not data.endswith(b"\n"):
                more = connection.recv(1 << 20)
                if not more:
                    raise OSError("the shim closed its connection")
                data += more
            request = json.loads(data)
        except (OSError, ValueError):
            connection.close()
            continue
        connection.settimeout(None)
        pid = os.fork()
        if pid == 0:
            listener.close()
            _kernel(connection, request, fds)
        for fd in fds:
            os.close(fd)
        try:
            connection.sendall(f"{pid}\n".encode())
        except OSError:
            pass
        connection.close()
    listener.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        shim(sys.argv[1:])
