"""Benchmark posenc's rotary embeddings against the Hugging Face recipe and a copy roofline.

    python benchmarks/bench_rotary.py                  # CPU, eager and torch.compile -> results/rotary-cpu-<date>.json
    python benchmarks/bench_rotary.py --no-compiled    # eager only (compiling takes minutes on a small CPU)
    python benchmarks/bench_rotary.py --device cuda    # on a GPU -> results/rotary-gpu-<date>.json

Shapes (float32, q and k both ``[batch, heads, seq_len, head_dim]``, the "half" layout of Hugging Face):

- ``(1, 32, 2048, 128)``: a prefill of 2,048 tokens (32 MB per tensor);
- ``(1, 32, 1, 128)``: one decoding step at position 2,047 (per-call overhead).

Variants, all rotating q and k at the same positions:

- ``hf``: ``apply_rotary_pos_emb(q, k, cos, sin)`` with ``LlamaRotaryEmbedding``'s tables computed once outside the
  timed call (a model computes them once per forward and shares them across layers): tests/rotary_peers.py;
- ``hf_with_tables``: the same plus the table computation (``LlamaRotaryEmbedding.forward``) in every call;
- ``posenc``: ``RotaryEmbedding(128, layout="half")(q, k, offset=...)``, the cached table sliced;
- ``posenc_apply``: ``apply_rotary(q, cos=cos, sin=sin, layout="half")`` and the same for k, tables precomputed
  (``posenc_apply_compiled``: that function compiled);
- with ``--compiled`` (default): ``torch.compile(fullgraph=True)`` of ``hf`` and of a function of (q, k) calling
  the ``posenc`` module (``posenc_compiled``: how a compiled model runs it, the module inlined in its graph); and
  ``posenc_compiled_module``, ``torch.compile`` of the module object itself, whose call goes through the wrapper
  module's own ``__call__`` as well (reported, not a goal).

Roofline: the time of a plain copy (``torch.clone``) of q, k and the table rows the call reads, measured in the same
rounds: the bytes any rotation must move, at the copy bandwidth achieved on this machine. A rotation that reads
q, k and the tables once and writes two outputs moves the same bytes as that copy, so ``ratio = copy time /
variant time`` is at most about 1.

Method (as benchmarks/bench.py): short interleaved rounds, each timing one block (about 2 ms of calls) of every
variant in a rotated order; ratios are taken within each round and reported as medians over the rounds with their
quartiles, so load from other processes hits both sides of a ratio alike. One intra-op thread on CPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from benchmarks.bench import ALLOCATOR_ENV, _load_average, allocator_env_active, machine  # noqa: E402
from posenc import RotaryEmbedding, apply_rotary  # noqa: E402
from tests.rotary_peers import hf_apply_rotary_pos_emb, hf_cos_sin  # noqa: E402

#: (batch, heads, seq_len, head_dim) -> (position of the first token, what the shape probes)
SHAPES: dict[tuple[int, int, int, int], tuple[int, str]] = {
    (1, 32, 2048, 128): (0, "prefill of 2,048 tokens: 32 MB per tensor, memory bound"),
    (1, 32, 1, 128): (2047, "one decoding step: per-call overhead"),
}
RESULTS = ROOT / "benchmarks" / "results"


def make_variants(
    shape: tuple[int, int, int, int],
    offset: int,
    device: torch.device,
    *,
    compiled: bool,
) -> tuple[dict[str, Callable[[], Any]], dict[str, int]]:
    """The callables to time for one shape, and the bytes each must move at least (read q, k, tables; write two)."""
    batch, _, seq_len, head_dim = shape
    torch.manual_seed(0)
    q = torch.randn(shape, device=device)
    k = torch.randn(shape, device=device)
    position_ids = torch.arange(offset, offset + seq_len, device=device).expand(
        batch, -1
    )
    cos, sin = hf_cos_sin(position_ids, head_dim)  # [batch, seq_len, head_dim] float32
    rope = RotaryEmbedding(head_dim, layout="half", max_len=4096).to(device)
    rope(q, k, offset=offset)  # fill the cache
    table_rows = (cos[0], sin[0])  # [seq_len, head_dim]

    def copy() -> None:
        q.clone(), k.clone(), table_rows[0].clone(), table_rows[1].clone()

    def hf_with_tables() -> Any:
        c, s = hf_cos_sin(position_ids, head_dim)
        return hf_apply_rotary_pos_emb(q, k, c, s)

    def posenc_apply() -> Any:
        kw = {"cos": table_rows[0], "sin": table_rows[1], "layout": "half"}
        return apply_rotary(q, **kw), apply_rotary(k, **kw)

    variants: dict[str, Callable[[], Any]] = {
        "roofline_copy": copy,
        "hf": lambda: hf_apply_rotary_pos_emb(q, k, cos, sin),
        "hf_with_tables": hf_with_tables,
        "posenc": lambda: rope(q, k, offset=offset),
        "posenc_apply": posenc_apply,
    }
    if compiled:
        # as inside a compiled model: a compiled function of (q, k) that calls the module,
        # next to the compiled Hugging Face function of (q, k, cos, sin)
        def rotate(q: torch.Tensor, k: torch.Tensor) -> Any:
            return rope(q, k, offset=offset)

        def apply_both(
            q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, s: torch.Tensor
        ) -> Any:
            kw = {"cos": c, "sin": s, "layout": "half"}
            return apply_rotary(q, **kw), apply_rotary(k, **kw)

        rope_c = torch.compile(rotate, fullgraph=True, dynamic=False)
        module_c = torch.compile(rope, fullgraph=True, dynamic=False)
        apply_c = torch.compile(apply_both, fullgraph=True, dynamic=False)
        hf_c = torch.compile(hf_apply_rotary_pos_emb, fullgraph=True, dynamic=False)
        variants["posenc_compiled"] = lambda: rope_c(q, k)
        variants["posenc_compiled_module"] = lambda: module_c(q, k, offset=offset)
        variants["posenc_apply_compiled"] = lambda: apply_c(q, k, *table_rows)
        variants["hf_compiled"] = lambda: hf_c(q, k, cos, sin)
    nbytes = 2 * 2 * q.numel() * q.element_size() + 2 * seq_len * head_dim * 4
    return variants, dict.fromkeys(variants, nbytes)


def time_shape(
    shape: tuple[int, int, int, int],
    offset: int,
    device: torch.device,
    *,
    seconds: float,
    block_s: float,
    compiled: bool,
    min_rounds: int = 15,
    max_rounds: int = 400,
) -> dict[str, Any]:
    variants, moved = make_variants(shape, offset, device, compiled=compiled)
    names = list(variants)
    timers = {
        n: benchmark.Timer("f()", globals={"f": variants[n]}, num_threads=1)
        for n in names
    }
    times: dict[str, list[float]] = {n: [] for n in names}
    calls: dict[str, int] = {}
    warmup_s: dict[str, float] = {}
    with torch.no_grad():
        for name in names:  # warm up (compilation, caches), then size the blocks
            start = time.perf_counter()
            for _ in range(3):
                variants[name]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            warmup_s[name] = round(time.perf_counter() - start, 2)
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
        start, rounds = time.perf_counter(), 0
        while rounds < max_rounds and (
            rounds < min_rounds or time.perf_counter() - start < seconds
        ):
            shift = rounds % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(timers[name].timeit(calls[name]).mean)
            rounds += 1

    def median_ratio(num: str, den: str) -> tuple[float, list[float]]:
        r = [a / b for a, b in zip(times[num], times[den])]
        q1, _, q3 = statistics.quantiles(r, n=4)
        return round(statistics.median(r), 3), [round(q1, 3), round(q3, 3)]

    ratio = {n: median_ratio("roofline_copy", n) for n in names}
    speedup = {n: median_ratio("hf", n) for n in names if n != "hf"}
    speedup_c = {
        n: median_ratio("hf_compiled", n)
        for n in names
        if "_compiled" in n and n != "hf_compiled"
    }
    return {
        "device": device.type,
        "shape": list(shape),
        "first_position": offset,
        "dtype": "float32",
        "rounds": rounds,
        "calls_per_block": calls,
        "warmup_s": warmup_s,
        "median_us": {
            n: round(statistics.median(t) * 1e6, 2) for n, t in times.items()
        },
        # copy time / variant time, paired by round: 1.0 = as fast as copying what it must read and write
        "ratio_to_roofline": {n: v[0] for n, v in ratio.items()},
        "ratio_to_roofline_quartiles": {n: v[1] for n, v in ratio.items()},
        # hf time / variant time, paired by round: > 1 = faster than the Hugging Face recipe
        "speedup_over_hf": {n: v[0] for n, v in speedup.items()},
        "speedup_over_hf_quartiles": {n: v[1] for n, v in speedup.items()},
        # hf_compiled time / variant time, paired by round (compiled variants only)
        "speedup_over_hf_compiled": {n: v[0] for n, v in speedup_c.items()},
        "speedup_over_hf_compiled_quartiles": {n: v[1] for n, v in speedup_c.items()},
        "bytes_moved": moved["roofline_copy"],
        "gb_per_s": {
            n: round(moved[n] / statistics.median(times[n]) / 1e9, 2) for n in names
        },
    }


def goals(results: list[dict[str, Any]], noise: float = 0.03) -> list[dict[str, Any]]:
    """The issue's goal: at least as fast as the Hugging Face recipe at every shape (eager vs eager, compiled vs
    compiled), within ``noise`` (a few per cent is the noise of a shared machine)."""
    checks = []
    for res in results:
        eager, compiled = (
            res["speedup_over_hf"],
            res.get("speedup_over_hf_compiled", {}),
        )
        pairs = [
            (n, "hf eager", eager[n]) for n in ("posenc", "posenc_apply") if n in eager
        ]
        pairs += [  # compiled vs compiled, paired by round
            (n, "hf compiled", compiled[n])
            for n in ("posenc_compiled", "posenc_apply_compiled")
            if n in compiled
        ]
        for name, against, value in pairs:
            checks.append({
                "device": res["device"], "shape": res["shape"],
                "goal": f"{name} at least as fast as {against}", "value": value, "met": value >= 1 - noise,
            })  # fmt: skip
    return checks


def run(
    device: str, *, seconds: float, block_s: float, compiled: bool
) -> dict[str, Any]:
    dev = torch.device(device)
    start = time.perf_counter()
    load_before = _load_average()
    results = []
    for shape, (offset, limit) in SHAPES.items():
        res = time_shape(
            shape, offset, dev, seconds=seconds, block_s=block_s, compiled=compiled
        )
        res["limit"] = limit
        results.append(res)
        print(
            f"{device} {tuple(shape)!s:20s} speedup over hf: "
            + ", ".join(f"{n} {v:.2f}" for n, v in res["speedup_over_hf"].items())
            + f" | ratio to copy roofline: posenc {res['ratio_to_roofline']['posenc']:.2f}",
            file=sys.stderr,
            flush=True,
        )
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "device": device,
        "machine": machine(dev.type),
        "allocator_env": ALLOCATOR_ENV if allocator_env_active() else None,
        "config": {
            "seconds_per_shape": seconds,
            "block_s": block_s,
            "threads": 1 if dev.type == "cpu" else None,
            "compiled": compiled,
            "dtype": "float32",
            "layout": "half",
        },
        "load_average": {"before": load_before, "after": _load_average()},
        "results": results,
        "goals": goals(results),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
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
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                        help="also time torch.compile variants (default: on)")  # fmt: skip
    parser.add_argument(
        "--out",
        default=None,
        help="results file, '-' for stdout; default: results/rotary-<dev>-<date>.json",
    )
    parser.add_argument(
        "--no-allocator-env",
        action="store_true",
        help="do not re-run with ALLOCATOR_ENV set",
    )
    args = parser.parse_args(argv)
    if (
        args.device == "cpu"
        and not args.no_allocator_env
        and not allocator_env_active()
    ):
        # glibc reads these variables when the process starts: run again with them set (see benchmarks/bench.py)
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, **ALLOCATOR_ENV}
        )
    report = run(
        args.device,
        seconds=args.seconds,
        block_s=args.block_ms / 1000,
        compiled=args.compiled,
    )
    text = json.dumps(report, indent=1)
    if args.out == "-":
        print(text)
        return 0
    prefix = "gpu" if args.device == "cuda" else "cpu"
    path = (
        Path(args.out)
        if args.out
        else RESULTS / f"rotary-{prefix}-{report['date']}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(f"wrote {path}", file=sys.stderr)
    for check in report["goals"]:
        mark = "met" if check["met"] else "NOT MET"
        print(
            f"  {tuple(check['shape'])!s:20s} {check['goal']}: {check['value']:.3f} {mark}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
