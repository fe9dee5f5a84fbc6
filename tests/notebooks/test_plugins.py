"""tests/plugin.py and tests/notebooks/plugin.py: a private torch.compile cache per run, notebooks whole on one
worker, torch's environment notices ignored, nothing else."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.notebooks.plugin import drop_torch_notices, strip_torch_notices

ROOT = Path(__file__).resolve().parents[2]
CUDA_NOTICE = "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'\n"
GUARDS_NOTICE = (
    "/x/torch/_dynamo/guards.py:1344: RuntimeWarning: Guards may run slower on Python 3.13.0. "
    "Consider upgrading to Python 3.13.1+.\n  warnings.warn(\n"
)


def test_this_run_has_a_private_inductor_cache() -> None:
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert Path(cache).is_dir() and Path(cache).name == "inductor"
    assert Path(cache).parent.name.startswith("posenc-run-")
    assert (
        str(Path(cache).parent) == os.environ["POSENC_RUN_DIR"]
    )  # the run's directory, shared by workers


def test_kernels_are_compiled_in_the_compiling_process() -> None:
    # tests/plugin.py sets TORCHINDUCTOR_COMPILE_THREADS=1 unless it is set: no pool of compile workers
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    assert threads is not None, (
        "tests/plugin.py did not set TORCHINDUCTOR_COMPILE_THREADS"
    )
    from torch._inductor import config

    assert config.compile_threads == int(threads)


def test_only_torch_notices_are_stripped() -> None:
    assert strip_torch_notices(CUDA_NOTICE + GUARDS_NOTICE) == ""
    assert strip_torch_notices(CUDA_NOTICE + "a real error\n") == "a real error\n"
    outputs = [
        {"output_type": "stream", "name": "stderr", "text": CUDA_NOTICE},
        {"output_type": "stream", "name": "stdout", "text": CUDA_NOTICE},
        {"output_type": "stream", "name": "stderr", "text": "Traceback ...\n"},
    ]
    kept = drop_torch_notices(outputs)
    assert [o["name"] for o in kept] == ["stdout", "stderr"]  # stdout is never touched


def _notebook(path: Path, *cells: tuple[str, str]) -> None:
    """A notebook of code cells ``(source, stored stdout)``."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": index + 1,
                "id": f"cell-{index:03d}",
                "metadata": {},
                "source": code,
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": stored}
                ],
            }
            for index, (code, stored) in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {
                "name": "python3",
                "display_name": "Python 3",
                "language": "python",
            }
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def _env() -> dict[str, str]:
    """This environment without options meant for the outer run (tools/test_time.py's PYTEST_ADDOPTS)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return {**env, "PYTHONPATH": str(ROOT)}


def _nbval(*paths: Path) -> subprocess.CompletedProcess:
    """One nested nbval run over ``paths`` as ``make test-portable`` runs ``book/``: two xdist workers, with
    ``--dist loadgroup``, no tests/conftest.py; ``-rA``: a line per outcome."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "--color=no", "-p", "no:cacheprovider", "-c", "/dev/null",
         "--rootdir", str(paths[0].parent), "-p", "tests.plugin", "-p", "tests.notebooks.plugin", "--nbval",
         "--nbval-current-env",
         "-n", "2", "--dist", "loadgroup", *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, env=_env(),
    )  # fmt: skip


@pytest.mark.slow
def test_notebooks_stay_whole_on_two_workers_and_only_torch_notices_pass_stderr(
    tmp_path: Path,
) -> None:
    pytest.importorskip("nbval")
    pytest.importorskip("xdist")
    notice = tmp_path / "notice.ipynb"
    _notebook(
        notice,
        (
            "import logging, sys\n"
            "logging.basicConfig(stream=sys.stderr)\n"
            f"logging.getLogger('torch.utils.cpp_extension').warning({CUDA_NOTICE.strip()!r})\n"
            "word = 'result'\n"
            "print(word)",
            "result\n",
        ),
        # later cells need the first one's kernel: split over two workers, they would fail with a NameError
        *((f"print(word * {n})", "result" * n + "\n") for n in range(1, 6)),
    )
    other = tmp_path / "other.ipynb"
    _notebook(
        other,
        ("import sys\nprint('oops', file=sys.stderr)\nprint('result')", "result\n"),
    )
    result = _nbval(notice, other)
    out = result.stdout
    for cell in range(6):
        assert re.search(rf"^PASSED \S*notice\.ipynb::Cell {cell}\b", out, re.M), out[
            -3000:
        ]
    assert re.search(r"^FAILED \S*other\.ipynb::Cell 0\b", out, re.M), out[-3000:]
    assert "stderr" in out and "NameError" not in out, out[-3000:]
    assert result.returncode != 0 and "1 failed, 6 passed" in out, out[-3000:]


def test_the_iri_grammar_is_not_built_and_notebooks_still_validate() -> None:
    import nbformat

    assert "rfc3987_syntax" in sys.modules and sys.modules["rfc3987_syntax"] is None
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nbformat.validate(
            nbformat.read(path, as_version=4)
        )  # raises if a notebook is invalid


def test_scheduling_units() -> None:
    from tests.plugin import scope_of

    assert scope_of("book/01_derivation.ipynb::Cell 3") == "notebook book/01_derivation"
    assert (
        scope_of("book/01_derivation.ipynb::ipynb::Cell 3")
        == "notebook book/01_derivation"
    )
    assert scope_of("tests/book/test_layout.py::test_x[book/intro]") == "browser"
    assert (
        scope_of("tests/deployment/test_ddp.py::test_x")
        == "tests/deployment/test_ddp.py"
    )
    assert scope_of("tests/rotary/test_rotation_peers.py::test_x[1-2]") == "peers"
    assert (
        scope_of(
            "tests/sinusoidal/test_encoding_conventions.py"
            "::test_the_installed_hugging_face_tables"
        )
        == "peers"
    )
    assert (
        scope_of("tests/sinusoidal/test_encoding_conventions.py::test_x")
        == "tests/sinusoidal/test_encoding_conventions.py::test_x"
    )
    assert scope_of("tests/rotary/test_rotation.py::test_inductor_x[2]") == "compile"
    assert scope_of("tests/deployment/test_compile.py::test_x") == "compile"
    assert (
        scope_of(
            "tests/sinusoidal/test_encoding_precision.py"
            "::test_module_under_torch_compile"
        )
        == "compile"
    )


def test_every_test_that_compiles_is_in_the_compile_unit() -> None:
    import ast

    from tests.plugin import COMPILE_FILES, COMPILE_WORDS

    outside = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith(
                "test"
            ):
                continue
            source = ast.unparse(node)
            compiles = any(
                call in source for call in ("torch.compile", "torch.export", "_dynamo")
            )
            named = any(word in node.name for word in COMPILE_WORDS)
            if compiles and not named and path.name not in COMPILE_FILES:
                outside.append(f"{path.name}::{node.name}")
    assert not outside, (
        f"name these for what they do (compile, inductor, export): {outside}"
    )


def test_the_peers_unit_holds_every_test_that_imports_a_peer() -> None:
    # a file that imports a peer at its top level (require or Lazy, tests/references/peers.py) or a
    # benchmark that times one is in PEER_FILES; a test marked `peers` elsewhere is in PEER_TESTS; and
    # every entry names a real test
    import ast

    from tests.plugin import PEER_FILES, PEER_TESTS

    files, tests = set(), set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_calls = {
            n.func.id
            for statement in tree.body
            if not isinstance(statement, (ast.FunctionDef, ast.ClassDef))
            for n in ast.walk(statement)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        imported = {
            alias.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.module == "benchmarks"
            for alias in n.names
        }
        if top_calls & {"require", "Lazy"} or imported & {
            "bench_sincos",
            "bench_rotary",
        }:
            files.add(path.name)
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d) == "pytest.mark.peers" for d in node.decorator_list
            ):
                tests.add(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    assert files == set(PEER_FILES)
    assert tests == set(PEER_TESTS)
