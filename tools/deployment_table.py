"""The deployment support table: what each public posenc name gives through each deployment path.

    python tools/deployment_table.py --record   # run tests/deployment/test_deployment.py (all of it,
    the ONNX and AOTInductor
                                                # paths too: minutes, needs g++) and write what each
                                                # (path, case) gave -> benchmarks/results/deployment-cpu.json
    python tools/deployment_table.py --readme   # write that table into README.md (between its two markers)
    python tools/deployment_table.py            # print the table

Chapter 19 prints the same table from the same file, and every test of tests/deployment/test_deployment.py
checks that its result is still the one the file records, so the book, the README and
the tests cannot disagree.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.references.deployment_cases import (  # noqa: E402
    OUTCOMES,
    committed_outcomes,
    support_table,
)

BEGIN = "<!-- the deployment table: written by tools/deployment_table.py --readme -->"
END = "<!-- end of the deployment table -->"
VERSIONS = ("torch", "onnx", "onnxscript", "onnxruntime")


def record() -> int:
    """Run the deployment tests, recording, and write what they saw to OUTCOMES."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "POSENC_DEPLOYMENT_RECORD": folder, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", str(os.cpu_count() or 2),
             "tests/deployment/test_deployment.py", "-m", "deploy or not deploy"],
            cwd=ROOT, env=env,
        )  # fmt: skip
        outcomes: dict[str, dict[str, dict[str, str]]] = {}
        for part in sorted(Path(folder).glob("*.jsonl")):
            for line in part.read_text(encoding="utf-8").splitlines():
                seen = json.loads(line)
                entry = {"outcome": seen["outcome"], "message": seen["message"]}
                outcomes.setdefault(seen["path"], {})[seen["case"]] = entry
    if done.returncode:
        print(f"the deployment tests failed (exit {done.returncode}): nothing written")
        return 1
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    data = {
        "what": "tests/deployment/test_deployment.py: "
        "what each public name gave through each path "
        "(works: eager's result; refused: an error naming posenc; fails: a known failure)",
        "date": datetime.date.today().isoformat(),
        "versions": versions,
        "outcomes": {p: dict(sorted(c.items())) for p, c in sorted(outcomes.items())},
    }
    OUTCOMES.write_text(
        json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    print(f"wrote {OUTCOMES.relative_to(ROOT)}")
    return 0


def readme() -> int:
    path = ROOT / "README.md"
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"README.md lacks the markers {BEGIN!r} and {END!r}")
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    table = support_table(committed_outcomes())
    path.write_text(head + BEGIN + "\n\n" + table + "\n" + END + tail, encoding="utf-8")
    print("wrote the deployment table into README.md")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--record", action="store_true", help="run the tests and write the table's file"
    )
    parser.add_argument(
        "--readme", action="store_true", help="write the table into README.md"
    )
    args = parser.parse_args()
    if args.record and record():
        return 1
    if args.readme:
        return readme()
    if not args.record:
        print(support_table(committed_outcomes()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
