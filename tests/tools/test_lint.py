"""ruff is clean on the package, the tests, the tools, the benchmarks, the experiments and the notebooks (config:
pyproject.toml); the hand-written Python is also formatted (`ruff format --check`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which(
    "ruff"
)


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed in this environment")
def test_ruff_check_is_clean() -> None:
    targets = [
        p
        for p in ("posenc", "tests", "tools", "benchmarks", "experiments", "book")
        if (ROOT / p).exists()
    ]
    result = subprocess.run(
        [RUFF, "check", "--no-cache", *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed in this environment")
def test_ruff_format_is_clean() -> None:
    targets = [
        p
        for p in ("posenc", "tests", "tools", "benchmarks", "experiments", "book/_ext")
        if (ROOT / p).exists()
    ]
    result = subprocess.run(
        [RUFF, "format", "--check", "--no-cache", *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
