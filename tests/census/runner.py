"""Run the census over every discovered family, two processes at a time, and write the results.

Each family is checked in a worker process (a pool of :data:`PROCESSES`, spawned, one torch thread each), so that
a family whose modeling code leaks state or memory cannot touch the next one's, and a family that runs past
``compare.LIMIT`` seconds is stopped by an alarm in its worker. Nothing is cached on disk: a run builds every
tiny model afresh (they are small enough that building one costs well under a second).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

PROCESSES = 2
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
STATUSES = ("ok", "refused", "wrong", "unchecked", "not_built")


def results_path() -> Path:
    import transformers

    version = ".".join(transformers.__version__.split(".")[:2])
    return RESULTS / f"census-transformers-{version}.json"


def _start_worker() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()


def _check(family: str) -> dict[str, Any]:
    from tests.census.compare import check

    return check(family)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run(names: list[str] | None = None, processes: int = PROCESSES) -> dict[str, Any]:
    """The census of ``names`` (default: every discovered family): the results, as written to the JSON file."""
    import torch
    import transformers

    from tests.census.discovery import families

    found = {f.name: f for f in families()}
    chosen = list(found) if names is None else names
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        processes, mp_context=context, initializer=_start_worker
    ) as pool:
        entries = list(pool.map(_check, chosen))
    wall = time.perf_counter() - start
    for entry in entries:
        family = found.get(entry["family"])
        if family is not None:
            entry["rotary_classes"] = list(family.named + family.behaving)
        for key, value in entry.items():
            entry[key] = _finite(value)
    counts = {s: sum(e["status"] == s for e in entries) for s in STATUSES}
    return {
        "what": "posenc.swap_rotary(model) on a tiny random model of every transformers family "
        "that defines a rotary class (tests/census)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "processes": processes,
        "cpu_count": os.cpu_count(),
        "wall_seconds": round(wall, 1),
        "families": len(entries),
        "counts": counts,
        "results": sorted(entries, key=lambda e: e["family"]),
    }


def table(census: dict[str, Any]) -> str:
    """The per-family table, one line each, then the counts."""
    lines = [f"{'family':28} {'status':10} {'s':>6}  message"]
    for e in census["results"]:
        message = e.get("message") or ", ".join(e.get("replaced", []))
        lines.append(
            f"{e['family']:28} {e['status']:10} {e['seconds']:6.1f}  {message}"
        )
    counts = ", ".join(f"{k} {v}" for k, v in census["counts"].items())
    lines.append(f"{census['families']} families: {counts}; {census['wall_seconds']} s wall "
                 f"with {census['processes']} processes")  # fmt: skip
    return "\n".join(lines)


def write(census: dict[str, Any], path: Path | None = None) -> Path:
    path = path or results_path()
    path.write_text(json.dumps(census, indent=1) + "\n", encoding="utf-8")
    return path
