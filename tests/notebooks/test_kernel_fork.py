"""tests/notebooks/kernel_fork.py: nbval's kernels forked from the run's server behave as kernels started afresh do.

A kernel is started the way nbval starts one (its kernel spec manager, patched by tests/plugin.py); it runs
code with the notebook's directory and environment, is interrupted, and goes away when the process jupyter_client
manages is killed. Without the run's directory, or with ``POSENC_FRESH_KERNELS=1``, the shim starts a fresh
kernel itself.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.notebooks import kernel_fork

nbval_kernel = pytest.importorskip("nbval.kernel")
pytest.importorskip("jupyter_client")
fresh_kernels = pytest.mark.skipif(
    not kernel_fork.enabled(),
    reason="kernels started afresh (POSENC_FRESH_KERNELS=1, or not Linux): no fork server in this run",
)


def _start(cwd: Path, env: dict[str, str] | None = None) -> tuple[Any, Any]:
    from jupyter_client import KernelManager

    manager = KernelManager(
        kernel_name=nbval_kernel.CURRENT_ENV_KERNEL_NAME,
        kernel_spec_manager=nbval_kernel.NbvalKernelspecManager(),
    )
    manager.start_kernel(cwd=str(cwd), env=env or dict(os.environ))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def _messages(
    client: Any, code: str, timeout: float = 30
) -> tuple[list[dict[str, Any]], str]:
    """The iopub messages (type and content) of running ``code``, up to its idle status, and the request's id."""
    msg_id = client.execute(code)
    seen = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen, msg_id
        if msg["msg_type"] in ("stream", "display_data", "execute_result", "error"):
            seen.append({"type": msg["msg_type"], **msg["content"]})


def _run(client: Any, code: str, timeout: float = 30) -> tuple[str, dict[str, Any]]:
    """The text ``code`` printed, and its execute reply's content."""
    seen, msg_id = _messages(client, code, timeout)
    printed = "".join(m["text"] for m in seen if m["type"] == "stream")
    return printed, _reply(client, msg_id, timeout)["content"]


def _reply(client: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (replies to earlier requests, e.g. kernel_info, are skipped)."""
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@fresh_kernels
def test_nbval_s_kernel_command_is_the_shim() -> None:
    spec = nbval_kernel.NbvalKernelspecManager().get_kernel_spec(
        nbval_kernel.CURRENT_ENV_KERNEL_NAME
    )
    assert spec.argv[1] == kernel_fork.SHIM and spec.argv[2:] == [
        "-f",
        "{connection_file}",
    ]


@fresh_kernels
def test_a_forked_kernel_runs_in_its_directory_and_environment_is_interrupted_and_dies_with_its_shim(
    tmp_path: Path,
) -> None:
    assert kernel_fork._socket_path() is not None, (
        "not in a test run with forked kernels"
    )
    env = {**os.environ, "POSENC_PROBE": "from the shim"}
    manager, client = _start(tmp_path, env)
    try:
        printed, reply = _run(
            client,
            f"kernel_fork_file = {kernel_fork.__file__!r}\n"
            "import os, sys\n"
            "print(os.getcwd(), os.environ['POSENC_PROBE'], sys.argv[0].endswith('ipykernel_launcher.py'))\n"
            # as in a kernel started with `python -m ipykernel_launcher`: the launcher's directory entry is
            # removed, IPython's '' is added
            "print('' in sys.path, os.path.dirname(kernel_fork_file) not in sys.path)\n"
            "print('torch' in sys.modules, os.getppid() != int(os.environ['JPY_PARENT_PID']))\n"
            "print(os.getpid())",
        )
        assert reply["status"] == "ok"
        lines = printed.splitlines()
        assert lines[0] == f"{tmp_path} from the shim True"
        assert lines[1] == "True True"  # sys.path as a fresh kernel's
        # imported before the first cell (forked from the server, not a child of this process)
        assert lines[2] == "True True"
        kernel_pid = int(lines[3])
        assert (
            kernel_pid != manager.provisioner.process.pid
        )  # the shim is what jupyter_client manages
        # an interrupt reaches the kernel through the shim
        # stop_on_error=False: after a failed request ipykernel aborts the requests that reach it while it is
        # still clearing its queue; the check below came back "aborted" in a loaded run (and before it read the
        # reply, its printed line was missing)
        msg_id = client.execute("import time\ntime.sleep(30)", stop_on_error=False)
        time.sleep(1.0)
        manager.interrupt_kernel()
        reply = _reply(client, msg_id, 20)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # the kernel still works (the answer read from the execute reply), then goes when its shim is killed
        msg_id = client.execute("", user_expressions={"answer": "6 * 7"})
        reply = _reply(client, msg_id, 30)["content"]
        assert reply["status"] == "ok", reply
        assert reply["user_expressions"]["answer"]["data"]["text/plain"] == "42"
        manager.provisioner.process.kill()
        assert _gone(kernel_pid, 15), "the kernel outlived its killed shim"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_kernel_shut_down_by_jupyter_exits_with_its_shim(tmp_path: Path) -> None:
    manager, client = _start(tmp_path)
    try:
        kernel_pid = int(_run(client, "import os\nprint(os.getpid())")[0])
        shim = manager.provisioner.process
    finally:
        client.stop_channels()
        manager.shutdown_kernel()
    assert _gone(kernel_pid, 15) and shim.poll() is not None


def test_fresh_kernels_without_a_run_directory_or_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POSENC_FRESH_KERNELS", raising=False)
    monkeypatch.setattr(kernel_fork.sys, "platform", "linux")
    assert kernel_fork._socket_path() == os.path.join(
        os.environ["POSENC_RUN_DIR"], kernel_fork.SOCKET_NAME
    )
    monkeypatch.setenv("POSENC_FRESH_KERNELS", "1")
    assert kernel_fork._socket_path() is None
    monkeypatch.delenv("POSENC_FRESH_KERNELS")
    monkeypatch.setenv("POSENC_RUN_DIR", str(tmp_path / "gone"))
    assert kernel_fork._socket_path() is None
    monkeypatch.delenv("POSENC_RUN_DIR")
    assert kernel_fork._socket_path() is None
    monkeypatch.setenv("POSENC_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_fork.sys, "platform", "darwin")
    assert kernel_fork._socket_path() is None
    monkeypatch.setattr(kernel_fork.sys, "platform", "linux")
    # and a run whose server could not start falls back at once, without waiting
    monkeypatch.setenv("POSENC_RUN_DIR", str(tmp_path))
    (tmp_path / (kernel_fork.SOCKET_NAME + ".failed")).touch()
    start = time.monotonic()
    assert kernel_fork._connect(str(tmp_path / kernel_fork.SOCKET_NAME), 30.0) is None
    assert time.monotonic() - start < 5


def test_a_run_s_kernel_draws_each_figure_once_and_makes_no_image(
    tmp_path: Path,
) -> None:
    # tests/notebooks/startup.py, the run's PYTHONSTARTUP (tests/plugin.py), in a kernel started as nbval starts
    # one (forked or fresh): a figure is displayed as its text, drawn once, with no PNG; nothing is left in the
    # notebook's namespace; a draw-time error still reaches the cell's output
    from tests.notebooks.plugin import STARTUP

    assert os.environ["PYTHONSTARTUP"] == STARTUP
    manager, client = _start(tmp_path)
    try:
        shown, _ = _messages(
            client,
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(3, 2))\n"
            "ax.plot([0, 1], [0, 1])\n"
            "draws = []\n"
            "fig.canvas.mpl_connect('draw_event', lambda event: draws.append(event))\n"
            "plt.show()\n"
            "print(len(draws), [n for n in dir() if 'draw_' in n or 'encod' in n])",
        )
        displays = [m for m in shown if m["type"] == "display_data"]
        assert len(displays) == 1 and set(displays[0]["data"]) == {"text/plain"}
        assert displays[0]["data"]["text/plain"] == "<Figure size 300x200 with 1 Axes>"
        assert [m["text"] for m in shown if m["type"] == "stream"] == ["1 []\n"]
        broken, _ = _messages(
            client,
            "fig, ax = plt.subplots()\nax.set_title(r'$\\frac{1}$')\nplt.show()",
        )
        assert [m["ename"] for m in broken if m["type"] == "error"] == ["ValueError"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


SETTINGS = (
    "import sys\n"
    "print('torch._dynamo' in sys.modules and 'torch._inductor.compile_fx' in sys.modules)\n"
    "import torch._dynamo.config, torch._inductor.config\n"
    "print(repr(torch._inductor.config.get_config_copy()))\n"
    "print(repr(torch._dynamo.config.get_config_copy()))\n"
)


@fresh_kernels
def test_a_forked_kernel_s_inductor_and_dynamo_settings_are_a_fresh_interpreter_s(
    tmp_path: Path,
) -> None:
    # The server imports torch's compiler stack once (kernel_fork.PRELOAD), so the settings torch reads at import
    # are read in the server: from its environment (the run's, as every kernel's) and its working directory
    # (re-derived in each kernel). A kernel in a new directory has every setting of a fresh interpreter started
    # there with the same environment.
    import ast
    import subprocess
    import sys

    manager, client = _start(tmp_path)
    try:
        printed, reply = _run(client, SETTINGS)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["status"] == "ok", reply
    fresh = subprocess.run(
        [sys.executable, "-c", SETTINGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    preloaded, *forked = printed.splitlines()
    assert preloaded == "True"  # imported by the server, before the kernel's first cell
    assert fresh.splitlines()[0] == "False"
    for theirs, ours in zip(forked, fresh.splitlines()[1:]):
        theirs, ours = ast.literal_eval(theirs), ast.literal_eval(ours)
        assert theirs.keys() == ours.keys()
        differ = [name for name in ours if theirs[name] != ours[name]]
        assert not differ, {name: (theirs[name], ours[name]) for name in differ}
    assert ast.literal_eval(forked[1])["debug_dir_root"].startswith(str(tmp_path))
