"""tools/browser_cost.py: its summary and its argument checks (the browser passes themselves are a benchmark)."""

from __future__ import annotations

import pytest

from tools import browser_cost


def test_summary_is_the_median_of_each_way_and_bare_over_kept() -> None:
    passes = [
        {"way": "bare", "wall_s": 50.0, "cpu_s": 77.0},
        {"way": "kept", "wall_s": 40.0, "cpu_s": 50.0},
        {"way": "bare", "wall_s": 46.0, "cpu_s": 71.0},
        {"way": "kept", "wall_s": 38.0, "cpu_s": 54.0},
        {"way": "bare", "wall_s": 48.0, "cpu_s": 75.0},
    ]
    got = browser_cost.summarize(passes)
    assert got["bare"] == {"wall_s": 48.0, "cpu_s": 75.0}
    assert got["kept"] == {"wall_s": 39.0, "cpu_s": 52.0}
    assert got["bare_over_kept"] == {
        "wall_s": round(48 / 39, 3),
        "cpu_s": round(75 / 52, 3),
    }
    with pytest.raises(
        ValueError, match="passes has no 'kept' pass: give each way at least one"
    ):
        browser_cost.summarize(passes[::2])


def test_busy_cpu_seconds_only_grows() -> None:
    first = browser_cost.busy_cpu_seconds()
    sum(i * i for i in range(200_000))
    assert browser_cost.busy_cpu_seconds() >= first > 0


def test_rounds_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        browser_cost.main(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
