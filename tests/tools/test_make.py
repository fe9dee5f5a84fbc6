"""The Makefile a newcomer meets: `make help` lists every target, and `make lab` starts JupyterLab, as root too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"


def phony_targets() -> list[str]:
    match = re.search(r"^\.PHONY:(.*)$", MAKEFILE.read_text(), re.MULTILINE)
    assert match, "the Makefile has no .PHONY line"
    return match.group(1).split()


def make(*args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return result.stdout


def test_help_lists_every_target() -> None:
    shown = re.findall(r"^make (\S+)", make("help"), re.MULTILINE)
    targets = phony_targets()
    assert set(targets) <= set(shown), (
        f"`make help` omits {sorted(set(targets) - set(shown))}"
    )
    defined = set(re.findall(r"^([a-z][\w-]*):", MAKEFILE.read_text(), re.MULTILINE))
    assert defined <= set(targets), f"targets not in .PHONY: {defined - set(targets)}"


def test_book_is_built_only_when_an_input_is_newer_than_the_last_build(
    tmp_path: Path,
) -> None:
    # `make -n`: what `make book` would run, with the last build's stamp in tmp_path (nothing is built)
    stamp = tmp_path / "built"

    def builds(*args: str) -> bool:
        return "jupyter-book build" in make("-n", "book", f"BOOK_STAMP={stamp}", *args)

    assert builds(), "no last build: `make book` must build"
    future = time.time() + 3600
    stamp.touch()
    os.utime(stamp, (future, future))  # newer than every input
    assert not builds(), "`make book` rebuilds an unchanged book"
    for changed in ("book/intro.md", "book/01_derivation.ipynb", "book/_static/posenc.css",
                    "posenc/sinusoidal/encoding.py", "_toc.yml", "experiments/position/model.py"):  # fmt: skip
        assert builds("-W", changed), f"`make book` ignores a change to {changed}"


def _fake_id(tmp_path: Path, uid: int) -> dict[str, str]:
    """An environment whose `id -u` prints ``uid`` (a script ahead of the real one on PATH)."""
    bin_dir = tmp_path / f"uid-{uid}"
    bin_dir.mkdir()
    fake = bin_dir / "id"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = "-u" ] && echo {uid} || exec /usr/bin/id "$@"\n'
    )
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _lab_command(env: dict[str, str]) -> str:
    lines = [ln for ln in make("-n", "lab", env=env).splitlines() if "jupyter" in ln]
    assert lines, "`make -n lab` runs no jupyter command"
    return lines[-1]


def test_recipes_may_cache_bytecode_where_the_environment_forbids_it() -> None:
    # every test process imports the package and the tests: the Makefile unexports PYTHONDONTWRITEBYTECODE
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    probe = 'probe: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"'
    assert make("--eval", probe, "probe", env=env).strip() == "[]"


def test_lab_adds_allow_root_only_for_root(tmp_path: Path) -> None:
    root = _fake_id(tmp_path, 0)
    assert "--allow-root" in _lab_command(root)
    assert "--allow-root" not in _lab_command(_fake_id(tmp_path, 1000))
    assert "--allow-root" not in make("-n", "lab", "LAB_ARGS=", env=root)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="make lab is for POSIX shells")
def test_make_lab_starts_jupyterlab(tmp_path: Path) -> None:
    """`make lab` really starts the server here (as root when the tests run as root, which needs --allow-root);
    a private Jupyter config keeps it on 127.0.0.1, on a free port, without opening a browser."""
    config = tmp_path / "jupyter"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text(
        "c.ServerApp.open_browser = False\n"
        "c.ServerApp.ip = '127.0.0.1'\n"
        "c.ServerApp.port = 0\n"
        "c.ServerApp.token = 'posenc-test'\n"
    )
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    }
    process = subprocess.Popen(
        ["make", "--no-print-directory", "lab"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 90
        assert process.stdout is not None
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line)
            if re.search(r"http://127\.0\.0\.1:\d+/lab", line):
                break
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = "".join(seen)
    assert re.search(r"http://127\.0\.0\.1:\d+/lab", output), output[-3000:]
    assert "Running as root is not recommended" not in output, output[-3000:]
