"""Benchmark ``posenc.PositionalEncoding`` against the classic table-and-slice recipes and the machine's bandwidth.

    python benchmarks/bench.py                       # full sizes, CPU (and CUDA if available) -> results/*.json
    python benchmarks/bench.py --device cuda         # CUDA only (what `make gpu-check` runs)
    python benchmarks/bench.py --size small --out -  # a quick run, JSON on stdout

Method. Each shape ``(seq_len, batch, d_model)`` is timed with ``torch.utils.benchmark`` in short rounds: a round
times one block of each variant (as many calls as take about 2 ms), the variants' order rotated from round to
round, and rounds repeat for a few seconds. The figure of merit is the ratio ``baseline time / variant time`` taken
within each round, so a burst of load from another process hits both sides, reported as the median over the rounds
with its quartiles. Higher is better. (The baseline is stored under the key ``"roofline"`` in the results files,
its name in earlier versions; it is a baseline, not a roofline in the strict sense.)

- eval mode (under ``torch.no_grad()``): the baseline is ``torch.add(x, 1.0)``: one read of x and one write of the
  output, the least any ``x + PE`` can move. A method that reads a table also reads its rows; ``add_rows``
  (``x + rows``, rows an independent ``[seq_len, 1, d_model]`` tensor) is that floor for table readers. The
  machine's achievable bandwidth for the same bytes is measured by ``copy`` (``x.clone()``: one read, one write),
  and every variant's bytes per second are reported as a fraction of it (``fraction_of_copy_bandwidth``).
- train mode (dropout 0.1, ``x.requires_grad``): the baseline is ``dropout(x)`` alone.

The variants are posenc, restatements of labml's and spotpython's modules (``tests/references/classic.py``), and
with ``--compiled``: posenc under ``torch.compile`` (which reads the same table) and the encoding computed on the
fly inside one fused kernel (``torch.compile`` of ``x + where(even, sin, cos)(p * omega)`` in float64), which reads
no table at all.

On CPU, glibc returns a freed multi-megabyte block to the kernel and the next output of the same size page-faults
on every page, which costs more than the arithmetic. The script re-executes itself with
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_`` set (see ``ALLOCATOR_ENV``) so that freed
memory is kept and reused, as a long-running training process's caching allocator would; ``--no-allocator-env``
turns this off, and the full CPU run also records the roofline and posenc without it (``allocator_effect``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from posenc import PositionalEncoding, frequencies  # noqa: E402
from tests.references.classic import (  # noqa: E402
    LabmlPositionalEncoding,
    SpotpythonPositionalEncoding,
)

#: The shapes of the issue, (seq_len, batch, d_model), and the limit each one probes.
FULL_SHAPES: dict[tuple[int, int, int], str] = {
    (1, 8, 512): "one decoding step: per-call overhead",
    (128, 32, 512): "a training batch: 8 MB, in cache",
    (2048, 8, 512): "long sequences: 32 MB, memory bound",
    (4096, 1, 1024): "table read as large as x: 16 MB + 16 MB",
}
#: Small shapes for quick runs (the chapter under nbval, smoke tests).
SMALL_SHAPES: dict[tuple[int, int, int], str] = {
    (1, 8, 64): "one decoding step",
    (64, 8, 128): "a small batch",
    (256, 2, 256): "a table read as large as x",
}
#: glibc malloc settings that keep freed multi-megabyte blocks for reuse instead of unmapping them.
ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "34000000",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
    "MALLOC_TOP_PAD_": "100000000",
}
CLASSICS = ("labml", "spotpython")
DROPOUT = 0.1
RESULTS = ROOT / "benchmarks" / "results"


def allocator_env_active() -> bool:
    """True when this process was started with every ``ALLOCATOR_ENV`` variable set as above."""
    return all(os.environ.get(k) == v for k, v in ALLOCATOR_ENV.items())


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine(device: str) -> dict[str, Any]:
    """A description of the machine, for the results file."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                line.split(":", 1)[1].strip()
                for line in f
                if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            gpu_count=torch.cuda.device_count(),
        )
    return info


def paired_rounds(
    timers: dict[str, Any],
    calls: dict[str, int],
    times: dict[str, list[float]],
    *,
    seconds: float,
    min_rounds: int,
    max_rounds: int,
) -> int:
    """Time every variant once per round, ``calls[name]`` calls a block, appending the per-call seconds to
    ``times[name]``; the order rotates each round, so that no variant always runs first (or right after the
    same one). Rounds go on until ``seconds`` have passed (at least ``min_rounds``, at most ``max_rounds``).
    Returns the number of rounds: ratios are then taken round by round (:func:`paired_ratio`)."""
    names = list(timers)
    start, rounds = time.perf_counter(), 0
    while rounds < max_rounds and (
        rounds < min_rounds or time.perf_counter() - start < seconds
    ):
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timers[name].timeit(calls[name]).mean)
        rounds += 1
    return rounds


def paired_ratio(
    times: dict[str, list[float]], num: str, den: str
) -> tuple[float, list[float]]:
    """Median over rounds of ``times[num] / times[den]`` and its quartiles (3 decimals)."""
    r = [a / b for a, b in zip(times[num], times[den])]
    q1, _, q3 = statistics.quantiles(r, n=4)
    return round(statistics.median(r), 3), [round(q1, 3), round(q3, 3)]


def _fused_on_the_fly(
    d_model: int, device: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x + PE`` with the encoding computed per element inside one fused kernel (float64 angles, no table)."""
    omega = frequencies(d_model).to(device)  # [ceil(d/2)], float64
    omega_per_channel = omega.repeat_interleave(2)[
        :d_model
    ]  # channel j has frequency omega_{j // 2}
    is_sine = torch.arange(d_model, device=device) % 2 == 0

    def forward(x: torch.Tensor) -> torch.Tensor:
        p = torch.arange(x.shape[0], device=x.device, dtype=torch.float64).view(
            -1, 1, 1
        )
        # angle[p, j] = p * omega_{j // 2}, the same float64 product as sinusoidal_encoding
        angle = p * omega_per_channel
        pe = torch.where(is_sine, torch.sin(angle), torch.cos(angle))
        return x + pe.to(x.dtype)

    return torch.compile(forward, fullgraph=True, dynamic=False)


def make_variants(
    shape: tuple[int, int, int],
    device: torch.device,
    mode: str,
    *,
    compiled: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[dict[str, Callable[[], Any]], dict[str, int]]:
    """The callables to time for one shape, and the bytes each must move at least.

    Returns:
        ``(variants, bytes_moved)``: name -> zero-argument callable, and name -> bytes read and written.
    """
    seq_len, _, d_model = shape
    torch.manual_seed(0)
    x = torch.randn(shape, device=device, dtype=dtype)
    train = mode == "train"
    if train:
        x.requires_grad_(True)
    p = DROPOUT if train else 0.0
    posenc = PositionalEncoding(d_model, DROPOUT).to(device).train(train)
    labml = LabmlPositionalEncoding(d_model, DROPOUT).to(device).train(train)
    spot = SpotpythonPositionalEncoding(d_model, DROPOUT).to(device).train(train)
    nbytes = x.numel() * x.element_size()
    rows = seq_len * d_model * x.element_size()
    variants: dict[str, Callable[[], Any]] = {}
    moved: dict[str, int] = {}
    if train:
        variants["roofline"] = lambda: F.dropout(x, p, True)
    else:
        variants["roofline"] = lambda: torch.add(x, 1.0)
    moved["roofline"] = 2 * nbytes
    if not train:
        other_rows = torch.randn(seq_len, 1, d_model, device=device, dtype=dtype)
        variants["add_rows"] = lambda: x + other_rows
        moved["add_rows"] = 2 * nbytes + rows
    if not train:
        # the machine's achievable bandwidth for this size: read x once, write a new tensor once
        variants["copy"] = lambda: x.clone()
        moved["copy"] = 2 * nbytes
    variants["posenc"] = lambda: posenc(x)
    variants["labml"] = lambda: labml(x)
    variants["spotpython"] = lambda: spot(x)
    for name in ("posenc", *CLASSICS):
        moved[name] = 2 * nbytes + rows
    if compiled and not train:
        compiled_posenc = torch.compile(posenc, fullgraph=True, dynamic=False)
        fused = _fused_on_the_fly(d_model, device)
        variants["posenc_compiled"] = lambda: compiled_posenc(x)
        variants["on_the_fly_fused"] = lambda: fused(x)
        moved["posenc_compiled"] = 2 * nbytes + rows
        moved["on_the_fly_fused"] = 2 * nbytes
    return variants, moved


def time_shape(
    shape: tuple[int, int, int],
    device: torch.device,
    mode: str,
    *,
    seconds: float = 6.0,
    block_s: float = 0.002,
    max_rounds: int = 400,
    min_rounds: int = 15,
    threads: int = 1,
    compiled: bool = False,
) -> dict[str, Any]:
    """Time every variant of one shape in short interleaved rounds; report medians of per-round ratios.

    A round times one block of each variant, in an order rotated from round to round; a block is as many calls as
    take about ``block_s`` (at least one). Rounds are short, so a burst of load from another process hits the
    variants of a round alike, and the per-round ratio cancels it. Rounds repeat until ``seconds`` have passed
    (at least ``min_rounds``, at most ``max_rounds``).
    """
    variants, moved = make_variants(shape, device, mode, compiled=compiled)
    grad = torch.enable_grad() if mode == "train" else torch.no_grad()
    names = list(variants)
    timers = {
        n: benchmark.Timer("f()", globals={"f": variants[n]}, num_threads=threads)
        for n in names
    }
    times: dict[str, list[float]] = {name: [] for name in names}
    calls: dict[str, int] = {}
    compile_s: dict[str, float] = {}
    with grad:
        for name in names:  # warm up (lazy initialisation, table caches, compilation), then size the blocks
            start = time.perf_counter()
            for _ in range(3):
                variants[name]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if name in ("posenc_compiled", "on_the_fly_fused"):
                compile_s[name] = round(time.perf_counter() - start, 1)
            single = (
                timers[name]
                .timeit(
                    max(
                        1,
                        min(100, int(block_s / max(timers[name].timeit(1).mean, 1e-7))),
                    )
                )
                .mean
            )
            calls[name] = max(1, round(block_s / single))
        rounds = paired_rounds(
            timers,
            calls,
            times,
            seconds=seconds,
            min_rounds=min_rounds,
            max_rounds=max_rounds,
        )
    ratios = {
        name: [roof / t for roof, t in zip(times["roofline"], times[name])]
        for name in names
    }
    speedups = {
        name: [c / p for c, p in zip(times[name], times["posenc"])] for name in CLASSICS
    }

    def quartiles(values: list[float]) -> list[float]:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return [round(q1, 3), round(q3, 3)]

    result: dict[str, Any] = {
        "device": device.type,
        "mode": mode,
        "shape": list(shape),
        "dtype": "float32",
        "rounds": rounds,
        "calls_per_block": calls,
        "median_us": {
            n: round(statistics.median(t) * 1e6, 2) for n, t in times.items()
        },  # median over rounds
        "ratio": {
            n: round(statistics.median(r), 3) for n, r in ratios.items()
        },  # roofline time / variant time
        "ratio_quartiles": {n: quartiles(r) for n, r in ratios.items()},
        # classic time / posenc time, paired by round
        "posenc_speedup_over": {
            n: round(statistics.median(s), 3) for n, s in speedups.items()
        },
        "posenc_speedup_quartiles": {n: quartiles(s) for n, s in speedups.items()},
        "gb_per_s": {
            n: round(moved[n] / statistics.median(times[n]) / 1e9, 1)
            for n in names
            if n in moved
        },
    }
    if compile_s:
        result["warmup_with_compile_s"] = compile_s
    if "copy" in result["gb_per_s"]:
        copy_bw = result["gb_per_s"]["copy"]
        result["fraction_of_copy_bandwidth"] = {
            n: round(bw / copy_bw, 3) for n, bw in result["gb_per_s"].items()
        }
    return result


def goals(results: list[dict[str, Any]], noise: float = 0.03) -> list[dict[str, Any]]:
    """The issue's goals, checked on the eval-mode results.

    posenc is "at least as fast" as the faster classic recipe when the round-paired ratio
    ``classic time / posenc time`` has a median >= ``1 - noise`` (both read the same rows and add them; a
    difference below a few per cent is the noise of a shared machine).
    """
    checks = []
    for res in results:
        if res["mode"] != "eval":
            continue
        shape = tuple(res["shape"])
        best = max(CLASSICS, key=lambda n: res["ratio"][n])
        speedup = res["posenc_speedup_over"][best]
        checks.append(
            {
                "device": res["device"],
                "shape": list(shape),
                "goal": f"at least as fast as the faster classic recipe ({best})",
                "value": speedup,
                "met": speedup >= 1 - noise,
            }
        )
        if "fraction_of_copy_bandwidth" in res and shape[0] > 1:
            # a table reader moves (2b + 1) / (2b) times the bytes of a copy: its bound is the inverse
            _, batch, _ = shape
            bound = 2 * batch / (2 * batch + 1)
            fraction = res["fraction_of_copy_bandwidth"]["posenc"]
            checks.append(
                {
                    "device": res["device"],
                    "shape": list(shape),
                    "goal": f">= 0.9 x the traffic bound ({bound:.2f}) of the copy bandwidth",
                    "value": fraction,
                    "met": fraction >= 0.9 * bound,
                }
            )
    return checks


def run(
    device: str = "cpu",
    size: str = "full",
    modes: tuple[str, ...] = ("eval", "train"),
    *,
    seconds: float = 6.0,
    block_s: float = 0.002,
    threads: int | None = None,
    compiled: bool | None = None,
    budget_s: float | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark on one device and return the results (what the JSON file holds).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        size: ``"full"`` (the issue's shapes) or ``"small"``.
        modes: ``"eval"`` and/or ``"train"``.
        seconds: time spent on the interleaved rounds of each shape; ratios are medians over rounds.
        block_s: duration of one block (one variant's share of a round).
        threads: intra-op threads while timing; default 1 on CPU (robust on a shared machine), ignored on CUDA.
        compiled: also time ``torch.compile`` variants; default: on CUDA only (CPU compiles take minutes).
        budget_s: stop starting new shapes after this many seconds (the shapes done are kept).
        log: where progress lines go (default: stderr).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device='cuda' requested but torch.cuda.is_available() is False"
        )
    shapes = FULL_SHAPES if size == "full" else SMALL_SHAPES
    threads = threads or 1
    compiled = dev.type == "cuda" if compiled is None else compiled
    start = time.perf_counter()
    load_before = _load_average()
    results, skipped = [], []
    for mode in modes:
        for shape, limit in shapes.items():
            if budget_s is not None and time.perf_counter() - start > budget_s:
                skipped.append(
                    {
                        "mode": mode,
                        "shape": list(shape),
                        "reason": f"time budget of {budget_s:.0f} s spent",
                    }
                )
                continue
            res = time_shape(
                shape,
                dev,
                mode,
                seconds=seconds,
                block_s=block_s,
                threads=threads,
                compiled=compiled,
            )
            res["limit"] = limit
            results.append(res)
            log(
                f"{device} {mode:5s} {shape!s:17s} ratio vs roofline: "
                + ", ".join(f"{n} {r:.2f}" for n, r in res["ratio"].items())
            )
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "device": device,
        "machine": machine(dev.type),
        "allocator_env": ALLOCATOR_ENV if allocator_env_active() else None,
        "config": {
            "size": size,
            "modes": list(modes),
            "seconds_per_shape": seconds,
            "block_s": block_s,
            "threads": threads if dev.type == "cpu" else None,
            "compiled": compiled,
            "dropout": DROPOUT,
            "dtype": "float32",
        },
        "load_average": {
            "before": load_before,
            "after": _load_average(),
        },  # other processes on the machine
        "results": results,
        "skipped": skipped,
        "goals": goals(results),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def latest_results(device: str, directory: Path = RESULTS) -> dict[str, Any] | None:
    """The most recent full-size results file for ``device`` ("cpu" or "gpu"), or None if there is none."""
    files = sorted(
        p for p in directory.glob(f"{device}-*.json") if not p.stem.endswith("-small")
    )
    return json.loads(files[-1].read_text()) if files else None


def allocator_effect(
    shape: tuple[int, int, int] = (2048, 8, 512), seconds: float = 4.0
) -> dict[str, Any]:
    """Roofline and posenc times at ``shape`` (eval, CPU) in two child processes, with and without ALLOCATOR_ENV."""
    out: dict[str, Any] = {"shape": list(shape)}
    for label, keep in (("with_allocator_env", True), ("without_allocator_env", False)):
        env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
        if keep:
            env.update(ALLOCATOR_ENV)
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import torch; from benchmarks.bench import time_shape; "
            f"r = time_shape({tuple(shape)}, torch.device('cpu'), 'eval', seconds={seconds}); "
            "print(json.dumps(r['median_us']))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(ROOT)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        out[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["slowdown_without"] = {
        n: round(out["without_allocator_env"][n] / out["with_allocator_env"][n], 2)
        for n in out["with_allocator_env"]
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "all"),
        default="all",
        help="all: cpu, and cuda if available",
    )
    parser.add_argument("--size", choices=("full", "small"), default="full")
    parser.add_argument(
        "--modes", default="eval,train", help="comma-separated: eval, train"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=6.0,
        help="seconds of interleaved rounds per shape",
    )
    parser.add_argument(
        "--block-ms",
        type=float,
        default=2.0,
        help="duration of one variant's block in a round",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU intra-op threads while timing (default 1)",
    )
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="time the torch.compile variants (default: on CUDA only)")  # fmt: skip
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new shapes after this time",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results file, '-' for stdout; default: results/{cpu,gpu}-<date>.json",
    )
    parser.add_argument(
        "--no-allocator-env",
        action="store_true",
        help="do not re-run with ALLOCATOR_ENV set",
    )
    parser.add_argument(
        "--no-allocator-effect",
        action="store_true",
        help="skip the with/without allocator run",
    )
    args = parser.parse_args(argv)

    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if args.device == "all" and not torch.cuda.is_available():
        devices = ["cpu"]
    if "cpu" in devices and not args.no_allocator_env and not allocator_env_active():
        # glibc reads these variables when the process starts: run again with them set.
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, **ALLOCATOR_ENV}
        )
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    for device in devices:
        report = run(
            device, args.size, modes, seconds=args.seconds, block_s=args.block_ms / 1000,
            threads=args.threads, compiled=args.compiled, budget_s=args.budget_s,
        )  # fmt: skip
        if device == "cpu" and args.size == "full" and not args.no_allocator_effect:
            report["allocator_effect"] = allocator_effect()
        text = json.dumps(report, indent=1)
        if args.out == "-":
            print(text)
            continue
        prefix = "gpu" if device == "cuda" else "cpu"
        path = (
            Path(args.out)
            if args.out and len(devices) == 1
            else RESULTS / f"{prefix}-{report['date']}.json"
        )
        if args.size != "full" and not args.out:
            path = path.with_name(path.stem + "-small.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        print(f"wrote {path}", file=sys.stderr)
        for check in report["goals"]:
            mark = "met" if check["met"] else "NOT MET"
            print(
                f"  {check['device']} {tuple(check['shape'])!s:17s} {check['goal']}: {check['value']:.3f} {mark}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
