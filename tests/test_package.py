"""`import posenc` works from a wheel built from the repository, installed into a clean venv without book/."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

import posenc

ROOT = Path(__file__).resolve().parent.parent


def test_public_api() -> None:
    assert sorted(posenc.__all__) == sorted(
        name
        for name in dir(posenc)
        if not name.startswith("_")
        and name not in {"encoding", "module", "offsets"}
        and not isinstance(getattr(posenc, name), type(posenc))
    )
    for name in posenc.__all__:
        assert getattr(posenc, name).__doc__, f"posenc.{name} has no docstring"


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv_and_imports(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("posenc-*.whl")
    env_dir = tmp_path / "clean-venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Install the wheel by pip (from this environment) into the clean venv's site-packages, nothing else.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site, str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    # torch is not re-installed: a .pth line points at this environment's site-packages (a plain path line
    # does not run that directory's .pth files, so the editable install of posenc stays invisible).
    (Path(site) / "torch_from_host.pth").write_text(
        str(Path(torch.__file__).parent.parent) + "\n"
    )
    script = (
        "import posenc, torch, pathlib; "
        "assert 'clean-venv' in posenc.__file__, posenc.__file__; "
        "pe = posenc.PositionalEncoding(8, 0.0)(torch.zeros(3, 2, 8)); "
        "assert pe.shape == (3, 2, 8); "
        "assert not (pathlib.Path(posenc.__file__).parent.parent / 'book').exists(); "
        "print(posenc.__file__)"
    )
    result = subprocess.run(
        [python, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sysconfig.get_paths()["purelib"] != site


def _documented(obj: object, name: str) -> list[tuple[str, str]]:
    """(qualified name, docstring) of ``obj`` and, for a class, of each method it defines itself."""
    import inspect

    found = [(name, inspect.getdoc(obj) or "")]
    if inspect.isclass(obj):
        for attr, member in vars(obj).items():
            if (attr.startswith("_") and attr != "__init__") or not callable(member):
                continue
            found.append((f"{name}.{attr}", inspect.getdoc(member) or ""))
    return found


def test_docstrings_read_as_plain_text_in_help() -> None:
    """`help(posenc.X)` shows a docstring as it is written: no `$...$` math and no LaTeX commands, which a
    terminal prints raw (the API page shows the same plain text)."""
    import re

    latex = re.compile(r"\$|\\(?:[a-zA-Z]{2,}|[()\[\]{}])")
    docs = [("posenc", posenc.__doc__ or "")]
    for module in ("encoding", "module", "offsets", "rotary", "sincos"):
        mod = getattr(posenc, module, None)
        if mod is not None:
            docs.append((f"posenc.{module}", mod.__doc__ or ""))
    for name in posenc.__all__:
        docs += _documented(getattr(posenc, name), f"posenc.{name}")
    raw = [
        f"{name}: {match.group(0)!r} in ...{doc[max(0, match.start() - 30) : match.end() + 30]!r}"
        for name, doc in docs
        for match in [latex.search(doc)]
        if match
    ]
    assert not raw, "docstrings with LaTeX that help() prints raw:\n" + "\n".join(raw)


def test_floor_check_files_mark_every_test_that_needs_a_peer() -> None:
    # tools/floor_check.py runs these files against the wheel alone (no transformers, diffusers, timm) with
    # -m "not peers": a test there that calls tests.references.peers.require must carry the
    # mark, or the floor run fails
    import ast

    from tools.floor_check import OPTIONAL_TESTS, PACKAGE_TESTS

    unmarked = []
    for name in PACKAGE_TESTS + OPTIONAL_TESTS:
        tree = ast.parse((ROOT / "tests" / name).read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith(
                "test"
            ):
                continue
            calls = {
                n.func.id
                for n in ast.walk(node)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            marks = {ast.unparse(d) for d in node.decorator_list}
            if "require" in calls and "pytest.mark.peers" not in marks:
                unmarked.append(f"{name}::{node.name}")
    assert not unmarked, f"mark these @pytest.mark.peers: {unmarked}"
