"""The README's Python examples run as written (in order, in one namespace), so a newcomer's first paste works."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_python_examples_run() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 3, "the README's usage examples are gone"
    namespace: dict[str, object] = {}
    for index, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)


def test_readme_states_the_measured_make_test_time() -> None:
    # the time in the README's table is the median of the newest committed `make test-time` record
    import json

    records = sorted(
        (ROOT / "benchmarks" / "results").glob("test-time-*.json"),
        key=lambda p: json.loads(p.read_text())["date"],
    )
    assert records, "no committed make test-time record (tools/test_time.py)"
    newest = json.loads(records[-1].read_text())
    assert all(run["exit_status"] == 0 for run in newest["runs"]), (
        f"{records[-1].name} is a red run"
    )
    seconds = round(newest["median_make_test_wall_s"])
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    row = re.search(
        r"^\| `make test` \|.*\| (\d+) min (\d+) s \((\d+) s\) \|$", text, re.MULTILINE
    )
    assert row, (
        "the README's table has no `make test` row of the form 'M min S s (N s)'"
    )
    minutes, rest, total = map(int, row.groups())
    assert total == seconds and minutes * 60 + rest == seconds, (
        row.group(0),
        records[-1].name,
    )


def test_readme_states_the_experiments_recorded_time() -> None:
    # the `make experiment` row gives the wall time the committed results file recorded
    import json

    results = json.loads(
        (ROOT / "experiments" / "results" / "position-matters-cpu.json").read_text()
    )
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    row = re.search(r"^\| `make experiment` \|.*?\| (\d+) min \((\d+) s", text, re.M)
    assert row, "the README's `make experiment` row has no 'M min (N s' time"
    minutes, seconds = map(int, row.groups())
    assert seconds == round(results["wall_seconds"]), (row.group(0), seconds)
    assert minutes == round(results["wall_seconds"] / 60), (row.group(0), minutes)


def test_readme_states_the_recorded_census() -> None:
    # the census sentence's counts are those of the committed record (`python -m tests.census` writes it)
    import json

    record = next((ROOT / "benchmarks" / "results").glob("census-transformers-*.json"))
    census = json.loads(record.read_text(encoding="utf-8"))
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = re.search(
        r"(\d+) families, (\d+) the same, (\d+) refused with the reason, (\d+) that the census cannot build",
        text,
    )
    assert said, "the README's census sentence is gone"
    counts = census["counts"]
    assert [int(n) for n in said.groups()] == [
        census["families"],
        counts["ok"],
        counts["refused"],
        counts["not_built"],
    ], record.name
