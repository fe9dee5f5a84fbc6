"""Peak memory: ``PositionalEncoding``'s forward past its cache holds at most 1.5 times its output at once (counted
tensor by tensor, as torch allocates them), and benchmarks/bench_memory.py's bookkeeping. The benchmark itself
measures the resident set of a fresh process per case, at full size (``make bench``); book/12_performance.ipynb
reads its results."""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import posenc.sinusoidal.module
from benchmarks import bench_memory
from posenc import PositionalEncoding

ROOT = Path(__file__).resolve().parents[2]


class LiveBytes(TorchDispatchMode):
    """The peak bytes of the tensor storages that operations create and that are alive at once. Storages that
    existed before (the inputs, and views of them) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[int, int] = {}  # storage -> number of live tensors on it
        self.outside: set[int] = set()
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and self._key(t) not in self.holders:
                self.outside.add(self._key(t))
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and self._key(t) not in self.outside:
                self._hold(t)
        return out

    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def _hold(self, t: torch.Tensor) -> None:
        key, size = self._key(t), t.untyped_storage().nbytes()
        if key not in self.holders:
            self.holders[key] = 0
            self.now += size
            self.peak = max(self.peak, self.now)
        self.holders[key] += 1
        weakref.finalize(t, self._release, key, size)

    def _release(self, key: int, size: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.now -= size


def _peak(call: Any) -> tuple[int, int]:
    """(peak bytes alive at once, bytes of the result) of ``call()``."""
    with LiveBytes() as live:
        result = call()
    return live.peak, result.untyped_storage().nbytes()


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_the_forward_past_the_cache_holds_little_besides_its_output(
    grad: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PositionalEncoding(64)`` on 20,000 tokens past its cache of 5,000 positions, its pieces' temporaries kept
    within 64 KiB as they are kept within 16 MiB at full size: without autograd the rows are added piece by piece into
    the output, which is nearly all it holds; with autograd it holds the rows once, as ``x + table`` holds its table.
    Building the float64 rows for the whole sequence at once held about 6 times the output (the rows, and the
    angles, sines, cosines and their interleaving, each as large as the output or larger)."""
    monkeypatch.setattr(posenc.sinusoidal.encoding, "CHUNK_BYTES", 2**16, raising=False)
    module = PositionalEncoding(64).eval()
    x = torch.randn(20_000, 1, 64, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        peak, output = _peak(lambda: module(x))
    assert peak <= (2.25 if grad else 1.25) * output, peak / output


def test_the_live_bytes_count_sees_temporaries() -> None:
    """The counter can fail: ``(x + 1) * 2`` holds two results of x's size at once, ``x.sin()`` one."""
    x = torch.randn(1000)
    assert _peak(lambda: (x + 1) * 2) == (8000, 4000)
    assert _peak(lambda: x[10:].sin()) == (3960, 3960)


def test_the_benchmark_measures_a_case_and_checks_its_goal() -> None:
    """One case in this process at a 1/1024 of its size (the figures of a process that ran other tests are not the
    benchmark's: it runs each case in a fresh process), then the ratios and goals of a made-up record."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    figures = bench_memory.measure("get_positional_encoding", 1 / 1024)
    assert (
        figures["result_bytes"] == 256 * 256 * 4
        and figures["max_rss"] >= figures["rss_before"] > 0
    )
    record = {
        name: {"kind": bench_memory.CASES[name][0]}
        for name in ("x_plus_table", "pe_forward", "pe_cache")
    }
    record["x_plus_table"]["after"] = {
        "working": 100,
        "max_rss": 400,
        "result_bytes": 100,
    }
    record["pe_forward"]["after"] = {
        "working": 110,
        "max_rss": 700,
        "result_bytes": 100,
    }
    record["pe_cache"]["after"] = {"working": 140, "max_rss": 300, "result_bytes": 100}
    bench_memory._ratios(record, "after")
    goals = {
        goal["case"]: (goal["value"], goal["met"])
        for goal in bench_memory.goals(record)
    }
    assert goals == {"pe_forward": (1.75, False), "pe_cache": (1.4, True)}
    json.dumps(record)


def test_a_revision_is_exported_with_its_subpackages(tmp_path) -> None:
    # --before imports posenc from the exported revision alone: every module, the subpackages' too
    commit = bench_memory._export_revision("HEAD", tmp_path)
    assert len(commit) == 40
    tracked = {p.relative_to(ROOT / "posenc") for p in (ROOT / "posenc").rglob("*.py")}
    exported = {
        p.relative_to(tmp_path / "posenc") for p in (tmp_path / "posenc").rglob("*.py")
    }
    assert {Path("rotary/rotation.py"), Path("sinusoidal/module.py")} <= exported
    assert exported <= tracked
