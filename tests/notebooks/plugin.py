"""The notebook-run plumbing of the test suite (README.md beside this file), loaded only where notebooks run: by
book/conftest.py, and by ``-p tests.notebooks.plugin`` where a run reads no conftest.

1. **torch's notices about its environment are not outputs.** A CUDA build of torch on a machine without a GPU
   logs "No CUDA runtime is found ..." and Python 3.13.0 makes dynamo warn "Guards may run slower ...". They
   say nothing about the notebook, so stderr lines matching :data:`TORCH_NOTICES` are removed before nbval
   compares a cell's outputs (and by ``tools/nbrun.py`` before outputs are stored). Any other stderr output
   still fails the cell.
2. **Kernels forked from one that has imported torch.** nbval's kernel command (``--nbval-current-env``) becomes
   the shim of tests/notebooks/kernel_fork.py, which forks each notebook's kernel from one process of the run
   that has imported torch, numpy, IPython and matplotlib, instead of every kernel importing them again
   (``POSENC_FRESH_KERNELS=1``: kernels started afresh, as ``make test-portable`` runs them).
3. **Figures drawn, not encoded.** nbval compares a figure's text (``<Figure size ... with 3 Axes>``), never its
   image. The run's kernels start with tests/notebooks/startup.py (``PYTHONSTARTUP``, replacing any of the
   user's, whose code would run in every kernel): each figure is drawn once, so that a draw-time error still
   fails its cell, and no PNG is made. ``make notebooks`` stores real PNGs.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

#: stderr lines that torch prints about the machine it runs on, never about the computation.
TORCH_NOTICES = (
    re.compile(r"^.*No CUDA runtime is found, using CUDA_HOME=.*$"),
    re.compile(r"^.*Guards may run slower on Python 3\.13\.0.*$"),
    re.compile(
        r"^\s*warnings\.warn\($"
    ),  # the source line Python prints under such a warning
)


def strip_torch_notices(text: str) -> str:
    """``text`` without the lines matching :data:`TORCH_NOTICES` (other lines kept in order)."""
    lines = text.splitlines(keepends=True)
    kept = [
        ln for ln in lines if not any(p.match(ln.rstrip("\n")) for p in TORCH_NOTICES)
    ]
    return "".join(kept)


def drop_torch_notices(outputs: list[Any]) -> list[Any]:
    """Notebook outputs with torch's notices removed from stderr streams; empty streams dropped."""
    kept = []
    for output in outputs:
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            text = strip_torch_notices("".join(output.get("text", "")))
            if not text:
                continue
            output = type(output)({**output, "text": text})  # NotebookNode stays one
        kept.append(output)
    return kept


#: The IPython start-up file of the run's notebook kernels (item 3).
STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py")


@pytest.hookimpl(trylast=True)  # after tests/plugin.py has made the run's directory
def pytest_configure(config: pytest.Config) -> None:
    # the run's kernels: figures drawn, not encoded (item 3)
    os.environ["PYTHONSTARTUP"] = STARTUP
    try:
        import nbval.plugin as nbval_plugin
    except ImportError:  # the package tests also run where Jupyter is not installed
        return
    _fork_kernels()
    original = nbval_plugin.transform_streams_for_comparison
    if getattr(original, "_posenc", False):
        return

    def transform(outputs: list[Any]) -> list[Any]:
        return original(drop_torch_notices(outputs))

    transform._posenc = True  # type: ignore[attr-defined]
    nbval_plugin.transform_streams_for_comparison = transform


def _fork_kernels() -> None:
    """nbval's kernels for ``--nbval-current-env`` started by tests/notebooks/kernel_fork.py (unless
    ``POSENC_FRESH_KERNELS=1``): the same ipykernel, forked from one process that has imported torch."""
    from tests.notebooks import kernel_fork

    if not kernel_fork.enabled():
        return
    import nbval.kernel as nbval_kernel

    manager = nbval_kernel.NbvalKernelspecManager
    original = manager.get_kernel_spec
    if getattr(original, "_posenc", False):
        return

    def get_kernel_spec(self: Any, kernel_name: str) -> Any:
        spec = original(self, kernel_name)
        launcher = spec.argv[1:3] == ["-m", "ipykernel_launcher"]
        if kernel_name == nbval_kernel.CURRENT_ENV_KERNEL_NAME and launcher:
            spec.argv = [spec.argv[0], kernel_fork.SHIM, *spec.argv[3:]]
        return spec

    get_kernel_spec._posenc = True  # type: ignore[attr-defined]
    manager.get_kernel_spec = get_kernel_spec
