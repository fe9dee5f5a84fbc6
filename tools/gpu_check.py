#!/usr/bin/env python3
"""The GPU check, for a machine with CUDA: ``make gpu-check`` or ``python3 tools/gpu_check.py``.

It needs only a ``python3`` with torch and pytest: no project venv, no Jupyter. The repository root is put on
``PYTHONPATH``, so ``posenc``, ``tests`` and ``benchmarks`` import from this checkout. In under five minutes it

1. runs ``python3 -m pytest -m gpu tests/`` (tests/deployment/test_gpu.py and any other test marked ``gpu``);
2. runs the benchmark on CUDA (``benchmarks/bench.py --device cuda``: eval and train modes, the classic recipes,
   the copy bandwidth, ``torch.compile`` with the table and with the encoding computed in one fused kernel), and
   the rotary benchmark (``benchmarks/bench_rotary.py --device cuda``, eager), which times posenc against the
   installed transformers: where transformers is not installed it is skipped and recorded as such;
3. writes ``benchmarks/results/gpu-<date>.json``: the benchmark's figures, the test outcome, the device, the date
   and the versions. book/11_gpu.ipynb and book/12_performance.ipynb display that file.

Exit status 0 only when CUDA is available, no selected test failed and the benchmark finished. Without CUDA it
writes nothing: GPU figures are recorded from a GPU or not at all.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST_TIMEOUT_S = 130  # the CUDA tests compile a few small graphs with triton
BENCH_TIMEOUT_S = 150  # hard limit for the benchmark process
BENCH_BUDGET_S = 90  # the benchmark starts no new shape after this


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_tests() -> dict[str, object]:
    """``python3 -m pytest -m gpu tests/``, summarised from its JUnit report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "tests/",
            "-q",
            "-rfEs",
            "-p",
            "no:cacheprovider",
        ]
        command += ["--continue-on-collection-errors", f"--junitxml={report}"]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                command,
                cwd=ROOT,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=PYTEST_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as error:
            out = (
                (error.stdout or b"").decode()
                if isinstance(error.stdout, bytes)
                else (error.stdout or "")
            )
            return {
                "command": " ".join(command[1:]),
                "timed_out": True,
                "output_tail": _tail(out),
                "ok": False,
            }
        summary: dict[str, object] = {
            "command": "python3 " + " ".join(command[1:-1]),
            "exit_status": proc.returncode,
            "wall_s": round(time.perf_counter() - start, 1),
            "output_tail": _tail(proc.stdout + proc.stderr),
        }
        if not report.exists():
            summary["ok"] = False
            return summary
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        cases = suite.findall("testcase") if suite is not None else []
        failed = [c for c in cases if c.find("failure") is not None]
        errors = [c for c in cases if c.find("error") is not None]
        skipped = [c for c in cases if c.find("skipped") is not None]
        collection = [
            c
            for c in errors
            if "collection failure" in (c.find("error").get("message") or "")
        ]
        summary.update(
            tests=len(cases) - len(collection),
            passed=len(cases) - len(failed) - len(errors) - len(skipped),
            failed=[f"{c.get('classname')}::{c.get('name')}" for c in failed],
            errors=[
                f"{c.get('classname')}::{c.get('name')}"
                for c in errors
                if c not in collection
            ],
            skipped=len(skipped),
            # test modules that could not be imported here (e.g. a package this machine lacks): their gpu tests,
            # if any, did not run
            collection_errors=[c.get("classname") or c.get("name") for c in collection],
        )
        summary["ok"] = not failed and not summary["errors"] and summary["passed"] > 0
        return summary


def run_benchmark(out: Path, *, rotary: bool = False) -> dict[str, object]:
    """``benchmarks/bench.py`` (or, with ``rotary``, ``benchmarks/bench_rotary.py``, eager only) on CUDA."""
    if rotary:
        command = [sys.executable, "benchmarks/bench_rotary.py", "--device", "cuda",
                   "--out", str(out), "--seconds", "3", "--no-compiled"]  # fmt: skip
    else:
        command = [
            sys.executable,
            "benchmarks/bench.py",
            "--device",
            "cuda",
            "--out",
            str(out),
        ]
        command += [
            "--seconds",
            "3",
            "--block-ms",
            "1",
            "--budget-s",
            str(BENCH_BUDGET_S),
        ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=BENCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the benchmark ran past {BENCH_TIMEOUT_S} s"}
    result: dict[str, object] = {
        "ok": proc.returncode == 0 and out.exists(),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    result["output_tail"] = _tail(proc.stdout + proc.stderr)
    return result


def main() -> int:
    start = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check: CUDA is not available (torch.cuda.is_available() is False); nothing run, nothing written."
        )
        return 2
    print(
        f"gpu-check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    tests = run_tests()
    print(tests["output_tail"])
    with tempfile.TemporaryDirectory() as tmp:
        bench_file = Path(tmp) / "bench.json"
        bench = run_benchmark(bench_file)
        print(bench.get("output_tail", bench.get("error", "")))
        record = (
            json.loads(bench_file.read_text())
            if bench_file.exists()
            else {"results": [], "goals": []}
        )
        rotary_file = Path(tmp) / "rotary.json"
        if importlib.util.find_spec("transformers") is None:
            # bench_rotary.py times posenc against the installed transformers
            rotary = {"ok": False, "skipped": "transformers is not installed here "
                      "(pip install transformers==5.23.0 to time rotary embeddings)"}  # fmt: skip
        else:
            rotary = run_benchmark(rotary_file, rotary=True)
        print(rotary.get("output_tail", rotary.get("error", rotary.get("skipped", ""))))
        if rotary_file.exists():
            record["rotary"] = json.loads(rotary_file.read_text())
    now = dt.datetime.now(dt.timezone.utc)
    record.setdefault("date", now.date().isoformat())
    record.setdefault("datetime_utc", now.isoformat(timespec="seconds"))
    record.setdefault("device", "cuda")
    record.setdefault(
        "machine",
        {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
    )
    record["tests"] = tests
    record["benchmark_run"] = {k: v for k, v in bench.items() if k != "output_tail"}
    record["rotary_benchmark_run"] = {
        k: v for k, v in rotary.items() if k != "output_tail"
    }
    record["gpu_check_wall_s"] = round(time.perf_counter() - start, 1)
    path = ROOT / "benchmarks" / "results" / f"gpu-{record['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    ok = bool(tests.get("ok")) and bool(bench.get("ok"))
    print(
        f"wrote {path.relative_to(ROOT)} in {record['gpu_check_wall_s']} s: {'OK' if ok else 'FAILED'}"
    )
    if tests.get("collection_errors"):
        print(
            "note: test modules not importable here (their gpu tests did not run):",
            tests["collection_errors"],
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
