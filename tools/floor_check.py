"""Test the package's stated floor: the wheel, in a clean venv with the oldest torch pyproject.toml admits.

    python tools/floor_check.py        (make test-floor; .ci/run runs it)

1. Reads the floor from ``pyproject.toml`` (``torch>=X.Y``) and creates ``.venv-floor`` with exactly ``torch==X.Y``
   (the first release of that line) and the test dependencies, unless it already holds them.
2. Builds the wheel from this checkout and installs it there (``--no-deps``, so nothing else comes along).
3. Copies ``tests/`` into a temporary folder (so ``import posenc`` finds the wheel, not this checkout) and runs the
   package tests that need no Jupyter, no browser and no built book. Tests of features with a higher floor
   (``tests/references/floors.py``: torch.export, torch.compile) skip there, saying so.

Exits non-zero when any step or test fails, or when no test ran.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-floor"
# The tests that exercise the package alone (the others check notebooks, the export, the book or lint).
PACKAGE_TESTS = [
    "sinusoidal/test_encoding.py",
    "sinusoidal/test_module.py",
    "sinusoidal/test_offsets.py",
    "sinusoidal/test_encoding_conventions.py",
    "sinusoidal/test_encoding_geometry.py",
    "sinusoidal/test_encoding_precision.py",
    "sinusoidal/test_module_reliability.py",
    "deployment/test_compile.py",
    "deployment/test_ddp.py",
    "sincos/test_embeddings.py",
]
OPTIONAL_TESTS = ["rotary/test_rotation.py"]
# torch 2.3 was built against NumPy 1.x; the rest is what tests/ imports.
TEST_DEPENDENCIES = [
    "numpy<2",
    "pytest>=8",
    "hypothesis>=6",
    "mpmath>=1.3",
    "pyyaml>=6",
]


def floor() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"torch>=(\d+\.\d+)(?:\.\d+)?"', text)
    if not match:
        sys.exit("floor_check: no `torch>=X.Y` dependency in pyproject.toml")
    return match.group(1)


def run(*args: object, **kwargs: object) -> None:
    print("+", " ".join(map(str, args)), flush=True)
    subprocess.run([str(a) for a in args], check=True, **kwargs)  # type: ignore[call-overload]


def main() -> int:
    version = floor()
    python = VENV / "bin" / "python"
    stamp = VENV / f".torch-{version}"
    if not stamp.exists():
        shutil.rmtree(VENV, ignore_errors=True)
        run(sys.executable, "-m", "venv", VENV)
        run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
            f"torch=={version}", *TEST_DEPENDENCIES)  # fmt: skip
        stamp.touch()
    with tempfile.TemporaryDirectory(prefix="posenc-floor-") as tmp:
        work = Path(tmp)
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
            "-w", work / "wheel", ROOT)  # fmt: skip
        (wheel,) = (work / "wheel").glob("posenc-*.whl")
        run(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
            "--disable-pip-version-check", wheel)  # fmt: skip
        shutil.copytree(ROOT / "tests", work / "tests",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        check = "import posenc, torch; print(torch.__version__, posenc.__file__)"
        found = subprocess.run([python, "-c", check], cwd=work, capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
        print(f"torch {found[0]}, posenc from {found[1]}")
        if not found[0].startswith(version + ".") or str(VENV) not in found[1]:
            sys.exit(
                f"floor_check: expected torch {version}.* and posenc from {VENV}, got {found}"
            )
        tests = [f"tests/{name}" for name in PACKAGE_TESTS]
        tests += [f"tests/{n}" for n in OPTIONAL_TESTS if (work / "tests" / n).exists()]
        result = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null",
             "--rootdir", work, "-p", "tests.plugin", "-m", "not gpu and not peers", *tests],
            cwd=work, env={**os.environ, "PYTHONPATH": str(work)},
        )  # fmt: skip
    if result.returncode != 0:
        print(f"floor_check: the package tests failed on torch {version} (exit {result.returncode};"
              " 5 means none ran)")  # fmt: skip
        return 1
    print(f"floor_check: the package tests pass on torch {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
