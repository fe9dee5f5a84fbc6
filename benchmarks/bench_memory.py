"""Peak memory of posenc's table builds and of ``PositionalEncoding``'s forward, on the CPU.

    python benchmarks/bench_memory.py                   # -> results/memory-<date>.json
    python benchmarks/bench_memory.py --before 0347e5c  # also posenc as it was at that git revision
    python benchmarks/bench_memory.py --scale 0.015625 --cases pe_forward,x_plus_table --out -   # small, to stdout

Each case runs in a fresh Python process (``--case NAME``, this same file), so that no case inherits another's
heap. The process imports torch and posenc, makes the inputs, resets the kernel's peak-RSS counter (writing ``5`` to
``/proc/self/clear_refs``), reads its resident set size, runs the call once and reads the peak (``VmHWM`` in
``/proc/self/status``). Two figures come out of each case:

- ``working``: the peak minus the resident size before the call: what the call itself needed at once (its result
  and every temporary alive at the same time);
- ``max_rss``: the process's peak resident size over its whole life (the import, the inputs and the call), the
  figure ``/usr/bin/time -v`` reports as "Maximum resident set size".

Why RSS and not an allocator's statistics: torch keeps no statistics for CPU memory (``torch.cuda.memory_stats``
has no CPU counterpart; the profiler's memory view costs a pass over every operation and reports allocations, not
what the process holds), and RSS is what an out-of-memory killer sees. Its limits: it counts pages, not bytes (4
KiB granularity); glibc keeps blocks below its mmap threshold (128 KiB, rising up to 32 MiB as large blocks are
freed) in its heap after they are freed, so a temporary of that size may still count after it is gone, while larger
ones are returned to the kernel at once. The children run with the environment's malloc settings removed
(``benchmarks.bench.ALLOCATOR_ENV`` keeps freed memory on purpose, for timing), with torch's default threads.

The goals, from the measurements: a table build uses at most 1.5 times its result (``working / result``), and
``PositionalEncoding`` on 10^6 tokens x 256 peaks at most 1.5 times the process that computes ``x + table`` from a
given table (``max_rss``; its ``working`` is reported beside it). The time of each call is recorded too; it is one
run on a shared machine, not a benchmark of speed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SCHEMA = "posenc.memory/1"
GOAL = 1.5
#: 10^6 tokens x 256 channels: the PositionalEncoding cases (x is [tokens, 1, 256] float32, 1.02 GB)
TOKENS, WIDTH = 10**6, 256
#: rows of the table builds: 2^18 rows of 256 float32 channels, 256 MiB
ROWS = 2**18

#: name -> (kind, what it measures). kind "forward": compared with x_plus_table by max_rss; "build": working / result.
CASES: dict[str, tuple[str, str]] = {
    "x_plus_table": (
        "baseline",
        "x + table, the table given: x, table and output [10^6, 1, 256] float32",
    ),
    "pe_forward": (
        "forward",
        "PositionalEncoding(256)(x), x [10^6, 1, 256] float32, eval, no_grad",
    ),
    "pe_forward_grad": (
        "forward",
        "the same with x.requires_grad (autograd records the addition)",
    ),
    "pe_positions": (
        "forward",
        "PositionalEncoding(256, batch_first=True)(x, positions=arange), x [1, 10^6, 256]",
    ),
    "pe_cache": (
        "build",
        "PositionalEncoding(256, max_len=2^18): the first forward fills its cache",
    ),
    "sinusoidal_encoding": ("build", "sinusoidal_encoding(2^18, 256), float32"),
    "get_positional_encoding": ("build", "get_positional_encoding(256, 2^18), float32"),
    "rotary_cos_sin": ("build", "rotary_cos_sin(2^18, 128): cos and sin, float32"),
    "rotary_module": (
        "build",
        "RotaryEmbedding(128, max_len=2^20): the first one-token forward fills its cache",
    ),
    "timestep_float32": (
        "build",
        "timestep_embedding(t, 256), 2^18 time steps in [0, 1000), float32",
    ),
    "timestep_bfloat16": (
        "build",
        "timestep_embedding(t, 256, dtype=torch.bfloat16), 2^18 time steps",
    ),
    "sincos_grid": ("build", "sincos_grid((512, 512), 256), float32"),
    "detr_sine_encoding": (
        "build",
        "detr_sine_encoding(mask [1, 512, 512], 128), float32",
    ),
}


# ---------------------------------------------------------------- in the child process


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _held_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj`` (a tensor, or a module's attributes,
    through dicts, lists and tuples): what a call returned or left in a module's cache."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, torch.nn.Module):
        return sum(_held_bytes(v, seen) for v in vars(obj).values())
    if isinstance(obj, dict):
        return sum(_held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_held_bytes(v, seen) for v in obj)
    return 0


def _case(name: str, scale: float) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """``(setup, call)`` of a case: ``call(setup())`` is measured; what it returns is the result."""
    import torch

    import posenc

    tokens, rows = max(1, int(TOKENS * scale)), max(1, int(ROWS * scale))
    side = max(1, int(512 * scale**0.5))

    def full(*shape: int) -> torch.Tensor:
        return torch.full(shape, 0.5)  # every page touched

    if name == "x_plus_table":
        return lambda: (
            full(tokens, 1, WIDTH),
            full(tokens, 1, WIDTH),
        ), lambda s: s[0] + s[1]
    if name in ("pe_forward", "pe_forward_grad"):

        def setup() -> Any:
            x = full(tokens, 1, WIDTH).requires_grad_(name == "pe_forward_grad")
            return posenc.PositionalEncoding(WIDTH).eval(), x

        if name == "pe_forward":
            return setup, lambda s: _no_grad(s[0], s[1])
        return setup, lambda s: s[0](s[1])
    if name == "pe_positions":
        setup = lambda: (  # noqa: E731
            posenc.PositionalEncoding(WIDTH, batch_first=True).eval(),
            full(1, tokens, WIDTH),
            torch.arange(tokens),
        )
        return setup, lambda s: _no_grad(s[0], s[1], positions=s[2])
    if name == "pe_cache":

        def fill(module: Any) -> Any:
            with torch.no_grad():
                module(torch.zeros(1, 1, WIDTH))
            return module

        return lambda: posenc.PositionalEncoding(WIDTH, max_len=rows), fill
    if name == "sinusoidal_encoding":
        return lambda: None, lambda _: posenc.sinusoidal_encoding(rows, WIDTH)
    if name == "get_positional_encoding":
        return lambda: None, lambda _: posenc.get_positional_encoding(WIDTH, rows)
    if name == "rotary_cos_sin":
        return lambda: None, lambda _: posenc.rotary_cos_sin(rows, 128)
    if name == "rotary_module":

        def first_step(module: Any) -> Any:
            q = torch.zeros(1, 1, 1, 128)
            with torch.no_grad():
                module(q, q)
            return module

        cached = max(1, int(2**20 * scale))
        return lambda: posenc.RotaryEmbedding(128, max_len=cached), first_step
    if name in ("timestep_float32", "timestep_bfloat16"):
        dtype = torch.float32 if name == "timestep_float32" else torch.bfloat16
        t = lambda: torch.rand(rows, generator=torch.Generator().manual_seed(0)) * 1000  # noqa: E731
        return t, lambda t: posenc.timestep_embedding(t, WIDTH, dtype=dtype)
    if name == "sincos_grid":
        return lambda: None, lambda _: posenc.sincos_grid((side, side), WIDTH)
    if name == "detr_sine_encoding":
        mask = lambda: torch.zeros(1, side, side, dtype=torch.bool)  # noqa: E731
        return mask, lambda m: posenc.detr_sine_encoding(m, 128)
    raise KeyError(name)


def _no_grad(module: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    with torch.no_grad():
        return module(*args, **kwargs)


def measure(name: str, scale: float) -> dict[str, Any]:
    """Run one case in this process and return its figures (this process should run nothing else)."""
    setup, call = _case(name, scale)
    state = setup()
    gc.collect()
    lifetime_kib = _status_kib("VmHWM")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the present resident size
    before_kib = _status_kib("VmRSS")
    start = time.perf_counter()
    result = call(state)
    seconds = time.perf_counter() - start
    peak_kib = _status_kib("VmHWM")
    result_bytes = _held_bytes(result)
    return {
        "rss_before": before_kib * 1024,
        "working": (peak_kib - before_kib) * 1024,
        "max_rss": max(lifetime_kib, peak_kib) * 1024,
        "result_bytes": result_bytes,
        "seconds": round(seconds, 3),
    }


# ---------------------------------------------------------------- in the parent process


def _export_revision(rev: str, directory: Path) -> str:
    """Write posenc as it was at git revision ``rev`` into ``directory/posenc``; return the commit."""
    package = directory / "posenc"
    package.mkdir(parents=True)

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return done.stdout

    for path in git("ls-tree", "-r", "--name-only", rev, "posenc/").split():
        if path.endswith(".py"):  # the subpackages too (posenc/rotary/...)
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(git("show", f"{rev}:{path}"))
    return git("rev-parse", rev).strip()


def run_child(
    name: str, scale: float, package_dir: Path | None = None
) -> dict[str, Any]:
    """Measure one case in a fresh process (posenc imported from ``package_dir`` when given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    path = [str(package_dir)] if package_dir else []
    env["PYTHONPATH"] = os.pathsep.join(
        [*path, str(ROOT), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--case",
        name,
        "--scale",
        repr(scale),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ratios(cases: dict[str, dict[str, Any]], version: str) -> None:
    """Add each case's ratio: working / result for a build, max_rss / x_plus_table's for a forward."""
    baseline = cases.get("x_plus_table", {}).get(version, {})
    for case in cases.values():
        figures = case.get(version)
        if not figures or "error" in figures:
            continue
        if case["kind"] == "build":
            figures["working_over_result"] = round(
                figures["working"] / figures["result_bytes"], 3
            )
        elif case["kind"] == "forward" and "max_rss" in baseline:
            figures["max_rss_over_baseline"] = round(
                figures["max_rss"] / baseline["max_rss"], 3
            )
            figures["working_over_baseline"] = round(
                figures["working"] / baseline["working"], 3
            )


def goals(
    cases: dict[str, dict[str, Any]], version: str = "after"
) -> list[dict[str, Any]]:
    """Each case against its goal: at most ``GOAL`` times its result (builds) or x + table's peak (forwards)."""
    out = []
    for name, case in cases.items():
        figures = case.get(version, {})
        key = {"build": "working_over_result", "forward": "max_rss_over_baseline"}.get(
            case["kind"]
        )
        if key is None or key not in figures:
            continue
        goal = (
            "working / result" if case["kind"] == "build" else "max RSS / x + table's"
        )
        out.append(
            {
                "case": name,
                "goal": f"{goal} <= {GOAL}",
                "value": figures[key],
                "met": figures[key] <= GOAL,
            }
        )
    return out


def run(names: list[str], scale: float, before: str | None = None) -> dict[str, Any]:
    """Measure ``names`` (each in a fresh process) for the working tree and, with ``before``, a git revision."""
    import platform

    started = time.perf_counter()
    load_before = os.getloadavg()
    cases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        commit = _export_revision(before, Path(tmp)) if before else None
        for name in names:
            kind, what = CASES[name]
            cases[name] = {"kind": kind, "what": what, "after": run_child(name, scale)}
            if before:
                cases[name]["before"] = run_child(name, scale, Path(tmp))
    for version in ("after", "before"):
        _ratios(cases, version)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "schema": SCHEMA,
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": importlib.metadata.version("torch"),
        },
        "load_average": {
            "before": [round(v, 2) for v in load_before],
            "after": [round(v, 2) for v in os.getloadavg()],
        },
        "scale": scale,
        "after": {"what": "the working tree", "head": head},
        "before": {"revision": before, "commit": commit} if before else None,
        "cases": cases,
        "goals": goals(cases),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def latest_results(directory: Path = RESULTS) -> dict[str, Any] | None:
    """The most recent full-size memory results file, or None."""
    files = sorted(directory.glob("memory-*.json"))
    return json.loads(files[-1].read_text()) if files else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--case", help=argparse.SUPPRESS
    )  # the child: one case, figures printed as JSON
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="size of every case, relative to the full one",
    )
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help="comma-separated case names (default: all)",
    )
    parser.add_argument(
        "--before", help="also measure posenc as it was at this git revision"
    )
    parser.add_argument(
        "--out", help="results file ('-': stdout); default results/memory-<date>.json"
    )
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(measure(args.case, args.scale)))
        return 0
    names = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    record = run(names, args.scale, args.before)
    text = json.dumps(record, indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.out) if args.out else RESULTS / f"memory-{record['date']}.json"
    path.write_text(text)
    for goal in record["goals"]:
        print(
            f"{goal['case']:24s} {goal['goal']:32s} {goal['value']:6.3f}  {'met' if goal['met'] else 'NOT met'}"
        )
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
