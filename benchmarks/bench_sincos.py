"""Benchmark posenc's time-step embeddings and grid tables against diffusers, on the CPU.

    python benchmarks/bench_sincos.py              # -> results/sincos-cpu-<date>.json
    python benchmarks/bench_sincos.py --seconds 2  # a quicker, noisier run
    python benchmarks/bench_sincos.py --memory     # peak memory of table builds -> results/sincos-memory-<date>.json

``--memory`` builds tables of 32 MiB (``MEMORY_CASES``), each in a fresh process, and records the growth of the
process's peak resident set (``/proc/self/status``: VmHWM, reset through ``/proc/self/clear_refs``) over the
result's size, once as posenc builds it (in chunks) and once in one block; glibc is told to return freed blocks of
64 KiB or more at once (``MEMORY_ENV``), so that the resident set follows what torch holds.

Groups (float32 results; each variant is compared with the group's baseline, diffusers, in the same rounds):

- ``timestep_distinct``: ``timestep_embedding(t, 320)`` against diffusers' ``get_timestep_embedding(t, 320)``
  (both with the defaults), 256 distinct float32 time steps in [0, 1000) (a flow-matching batch, or any batch of
  fractional steps); with ``into_output`` (posenc's road with fewer passes: the sines and cosines written straight
  into the output, no float64 concatenation), ``half_angle`` (one float64 tangent of each half angle instead of a
  sine and a cosine, the two read from it), and the plain float64 and float32 ``sin`` and ``cos`` of the same
  angles and the float64 ``tan``, which show what float64 trigonometry costs here: no road that takes a float64
  sine and cosine of every angle can be faster than ``float64_sin_cos``, and none that takes a float64 tangent of
  every angle faster than ``float64_tan``;
- ``timestep_integer``: the same for 256 integer time steps, ``randint(0, 1000)`` (a DDPM training batch), with
  ``angle_addition`` (the measured alternative below, complete with its argument checks),
  ``angle_addition_arithmetic`` (its gathers, complex products and layout copy alone, the tables and indices made
  beforehand: the part that grows with the batch) and ``table_lookup`` (``table[t]``, rows of
  ``timestep_embedding(torch.arange(1000), 320)`` made once beforehand: what a caller can keep between calls and
  posenc, which holds no state, does not);
- ``timestep_expanded``: the same with one time step expanded over the batch, ``t.expand(256)``, as diffusers'
  UNet and DiT pipeline pass a sampling step;
- ``module``: ``posenc.Timesteps(320, True, 0)`` against diffusers' ``Timesteps(320, True, 0)`` on 256 distinct
  time steps;
- ``grid``: ``sincos_grid((64, 64), 1152)`` against ``get_2d_sincos_pos_embed(1152, 64, base_size=64)`` cast to
  float32, as diffusers' ``PatchEmbed`` stores it (DiT-XL/2 at 512 x 512: a 64 x 64 grid of 2 x 2 latent
  patches, width 1152).

Method (as benchmarks/bench.py): interleaved rounds, each timing one block (about ``--block-ms`` of calls, at least
one call) of every variant of a group in a rotated order; ratios are taken within each round and reported as
medians over the rounds with their quartiles, so load from other processes hits both sides of a ratio alike. Every
group is timed at each ``--threads`` setting (default: one intra-op thread, then torch's default), and the script
re-executes itself with ``benchmarks.bench.ALLOCATOR_ENV`` set, as the other CPU benchmarks do. The results also
count the ATen operations of one call of each time-step variant (``aten_ops``), a machine-independent measure of the
eager work besides the arithmetic.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
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
from torch import Tensor  # noqa: E402
from torch.utils import benchmark  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.bench import (  # noqa: E402
    ALLOCATOR_ENV,
    _load_average,
    allocator_env_active,
    machine,
    paired_ratio,
    paired_rounds,
)
from posenc import Timesteps, sincos_grid, timestep_embedding  # noqa: E402
from posenc._checks import check_bool, values_checkable  # noqa: E402
from posenc.sincos._args import _check_timesteps, check_freq_args  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BATCH, DIM = 256, 320
GRID, GRID_DIM = (64, 64), 1152
#: what each group measures, as the results file and book/17_sincos_conventions name it
GROUPS = {
    "timestep_distinct": "timestep_embedding, 256 distinct time steps",
    "timestep_integer": "timestep_embedding, 256 integer time steps",
    "timestep_expanded": "timestep_embedding, one time step expanded",
    "module": "Timesteps module, 256 distinct time steps",
    "grid": "sincos_grid((64, 64), 1152)",
}
#: the largest integer time step the angle-addition road takes (its error bound is stated up to here)
ANGLE_ADDITION_MAX = 2**24 - 1


# ----------------------------------------------------------------------------------------------------------
# The measured alternatives (not in the package: see book/17_sincos_conventions, "Speed")
# ----------------------------------------------------------------------------------------------------------


def angle_addition_tables(
    half: int, shift: float, base: float, block: int, flip: bool
) -> Tensor:
    """The two tables of the angle-addition road, complex128 ``[block, 2, half]``.

    ``[k, 0]`` holds the rotation by ``k · block`` steps, ``[k, 1]`` the rotation by ``k`` steps:
    ``e^{i k block ω_j}`` and ``e^{i k ω_j}`` (``k < block``), made by repeated multiplication (``cumprod``) from the
    two float64 rotations ``e^{i block ω_j}`` and ``e^{i ω_j}``. For sines first (``flip=False``) the tables hold
    ``i · conj(...)`` and ``conj(...)``, so that a product of the two is ``sin θ + i cos θ``: real part first, in
    the output's order. ``ω_j`` is computed exactly as posenc's direct road computes it.
    """
    omega = torch.pow(base, -torch.arange(half, dtype=torch.float64) / (half - shift))
    sign = 1.0 if flip else -1.0
    theta = torch.outer(omega.new_tensor([sign * block, sign]), omega)  # [2, half]
    steps = torch.polar(torch.ones_like(theta), theta).expand(block, 2, half).clone()
    steps[0] = 1
    if not flip:
        steps[0, 0] = 1j
    return torch.cumprod(steps, 0)


def angle_addition_rows(
    t: Tensor, tables: Tensor, dim: int, dtype: torch.dtype
) -> Tensor:
    """The rows for integer time steps ``t`` ``[N]`` from ``angle_addition_tables``: ``[N, dim]`` of ``dtype``.

    ``t = a · block + b``; row ``t`` is ``tables[a, 0] · tables[b, 1]`` (one complex product per entry), its real
    and imaginary parts copied into the two halves of the output with one rounding to ``dtype``.
    """
    block, half = tables.shape[0], tables.shape[2]
    a = t.div(block, rounding_mode="floor")
    z = tables[:, 0].index_select(0, a)
    z *= tables[:, 1].index_select(0, t - a * block)
    out = torch.empty(t.shape[0], dim, dtype=dtype, device=t.device)
    out[:, : 2 * half].unflatten(1, (2, half)).copy_(
        torch.view_as_real(z).transpose(1, 2)
    )
    if dim % 2:
        out[:, -1] = 0
    return out


def angle_addition_block(t_max: int) -> int:
    """The block size B of the road for time steps up to ``t_max``: ``floor(sqrt(t_max)) + 1``, so a, b < B."""
    return math.isqrt(t_max) + 1


def angle_addition_embedding(
    timesteps: Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1.0,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """``posenc.timestep_embedding`` by angle addition, for integer time steps: ``[N] -> [N, dim]``.

    Integer tensors of at least 2 (non-expanded) time steps with ``2 B <= N`` (the two tables no larger than the
    batch), ``t <= ANGLE_ADDITION_MAX`` and float32 or float64 output take the road; everything else (fractional
    time steps, small batches, huge steps, bad arguments) is ``posenc.timestep_embedding``. With ``t = a B + b``
    (``B = angle_addition_block(max t)``) and u = 2^-53, the float64 value is within ``u (4 t + 6 (a + b) + 3)`` of
    the exact one (the direct road: ``u (4 t + 2)``), so a float32 result is within 2^-24 of it, as posenc's
    (book/17_sincos_conventions derives the bound, ``tests/tools/test_bench_sincos.py`` tests it against mpmath).
    """
    t, n = timesteps, 0
    if (
        isinstance(t, Tensor)
        and t.dim() == 1
        and not (t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool)
        and dtype in (None, torch.float32, torch.float64)
        and t.shape[0] > 1
        and t.stride(0) != 0
        and values_checkable(t)
    ):
        low, high = torch.aminmax(t)
        low, high = low.item(), high.item()
        block = angle_addition_block(max(high, 0))
        if low >= 0 and high <= ANGLE_ADDITION_MAX and 2 * block <= t.shape[0]:
            n = t.shape[0]
    if not n:
        return timestep_embedding(
            timesteps, dim, flip_sin_to_cos=flip_sin_to_cos,
            downscale_freq_shift=downscale_freq_shift, dtype=dtype,
        )  # fmt: skip
    dim, shift, _, base = check_freq_args(dim, downscale_freq_shift, 1.0, 10000)
    flip = check_bool("flip_sin_to_cos", flip_sin_to_cos, "True: cosines first")
    tables = angle_addition_tables(dim // 2, shift, base, block, flip)
    return angle_addition_rows(t, tables, dim, dtype or torch.float32)


def _direct_road(
    timesteps: Tensor, dim: int, flip_sin_to_cos: bool, downscale_freq_shift: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """posenc's argument checks and what a road writing straight into the output needs: the time steps ``[N]``,
    the float64 frequencies ``[dim // 2]`` as posenc computes them, the float32 output ``[N, dim]`` (its odd
    channel already zero) and its sine and cosine halves ``[N, dim // 2]`` (views, in the layout's order)."""
    t = _check_timesteps(timesteps)
    dim, shift, _, base = check_freq_args(dim, downscale_freq_shift, 1.0, 10000)
    flip = check_bool("flip_sin_to_cos", flip_sin_to_cos, "True: cosines first")
    half = dim // 2
    omega = torch.pow(base, -torch.arange(half, dtype=torch.float64) / (half - shift))
    out = torch.empty(t.shape[0], dim, dtype=torch.float32)
    if dim % 2:
        out[:, -1] = 0
    first, second = out[:, :half], out[:, half : 2 * half]
    return t, omega, out, (second if flip else first), (first if flip else second)


def into_output_embedding(
    timesteps: Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1.0,
) -> Tensor:
    """``posenc.timestep_embedding(timesteps, dim, ...)`` (float32) with fewer passes: the float64 sines and
    cosines are written straight into the float32 output's halves (one rounding each), with no float64
    ``[N, dim]`` concatenation and no separate rounding pass. The same checks and the same values, bitwise."""
    t, omega, out, sin_out, cos_out = _direct_road(
        timesteps, dim, flip_sin_to_cos, downscale_freq_shift
    )
    theta = t.to(torch.float64)[:, None] * omega
    torch.sin(theta, out=sin_out)
    torch.cos(theta, out=cos_out)
    return out


def half_angle_embedding(
    timesteps: Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1.0,
) -> Tensor:
    """``posenc.timestep_embedding(timesteps, dim, ...)`` (float32) from one float64 tangent per angle instead of
    a sine and a cosine: ``[N] -> [N, dim]``.

    With τ = tan(θ/2), sin θ = 2τ / (1 + τ²) and cos θ = (1 - τ²) / (1 + τ²) = 2 / (1 + τ²) - 1. The half angle
    is exactly half of posenc's rounded angle (``ω / 2`` is exact), τ is within 2 ulp, and it and the four
    roundings after it move either value by at most about 20 units of 2^-53 (to first order), so the float32
    result is within 2^-24 of the exact one, as posenc's (``tests/tools/test_bench_sincos.py`` checks it against
    mpmath); the same checks, not the same bits.
    """
    t, omega, out, sin_out, cos_out = _direct_road(
        timesteps, dim, flip_sin_to_cos, downscale_freq_shift
    )
    tau = torch.tan(t.to(torch.float64)[:, None] * (omega * 0.5))  # tan(θ / 2)
    r = torch.div(2.0, tau.square().add_(1.0))  # 2 / (1 + τ²)
    torch.mul(tau, r, out=sin_out)  # sin θ
    torch.sub(r, 1.0, out=cos_out)  # cos θ
    return out


# ----------------------------------------------------------------------------------------------------------
# The groups and their timing
# ----------------------------------------------------------------------------------------------------------


def make_groups() -> dict[str, dict[str, Callable[[], Any]]]:
    """The callables to time, per group; the first of each group is its baseline (diffusers)."""
    # imported here: the module's roads (book/17_sincos_conventions,
    # tests/tools/test_bench_sincos.py) need no diffusers, whose import takes seconds
    from diffusers.models.embeddings import Timesteps as DiffusersTimesteps
    from diffusers.models.embeddings import (
        get_2d_sincos_pos_embed,
        get_timestep_embedding,
    )

    torch.manual_seed(0)
    t = torch.rand(BATCH) * 1000
    t_int = torch.randint(0, 1000, (BATCH,))
    t_expanded = torch.tensor(500.0).expand(BATCH)
    half = DIM // 2
    omega = 1e4 ** (-torch.arange(half, dtype=torch.float64) / (half - 1))
    theta64 = t.double()[:, None] * omega  # the angles of both embeddings
    theta32 = theta64.float()
    block = angle_addition_block(int(t_int.max()))
    tables = angle_addition_tables(half, 1.0, 1e4, block, False)
    table = timestep_embedding(torch.arange(1000), DIM)  # every DDPM step, made once
    ours, theirs = Timesteps(DIM, True, 0), DiffusersTimesteps(DIM, True, 0)
    return {
        "timestep_distinct": {
            "diffusers": lambda: get_timestep_embedding(t, DIM),
            "posenc": lambda: timestep_embedding(t, DIM),
            "into_output": lambda: into_output_embedding(t, DIM),
            "half_angle": lambda: half_angle_embedding(t, DIM),
            "float64_sin_cos": lambda: (torch.sin(theta64), torch.cos(theta64)),
            "float64_tan": lambda: torch.tan(theta64),
            "float32_sin_cos": lambda: (torch.sin(theta32), torch.cos(theta32)),
        },
        "timestep_integer": {
            "diffusers": lambda: get_timestep_embedding(t_int, DIM),
            "posenc": lambda: timestep_embedding(t_int, DIM),
            "angle_addition": lambda: angle_addition_embedding(t_int, DIM),
            "angle_addition_arithmetic": lambda: angle_addition_rows(
                t_int, tables, DIM, torch.float32
            ),
            "table_lookup": lambda: table[t_int],
        },
        "timestep_expanded": {
            "diffusers": lambda: get_timestep_embedding(t_expanded, DIM),
            "posenc": lambda: timestep_embedding(t_expanded, DIM),
        },
        "module": {
            "diffusers": lambda: theirs(t),
            "posenc": lambda: ours(t),
        },
        "grid": {
            "diffusers": lambda: get_2d_sincos_pos_embed(
                GRID_DIM, GRID[0], base_size=GRID[0]
            ).float(),
            "posenc": lambda: sincos_grid(GRID, GRID_DIM),
        },
    }


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn: Callable[[], Any]) -> int:
    """How many ATen operations one call of ``fn`` dispatches (views and ``.item()`` included)."""
    with torch.no_grad(), _CountOps() as mode:
        fn()
    return mode.count


def time_group(
    variants: dict[str, Callable[[], Any]],
    *,
    seconds: float,
    block_s: float,
    threads: int = 1,
    min_rounds: int = 15,
    max_rounds: int = 400,
) -> dict[str, Any]:
    """Paired timings of one group at ``threads`` intra-op threads: each variant's speedup over the first
    (baseline) variant, median of the per-round ratios ``baseline time / variant time``, with quartiles; and the
    alternatives' speedups over posenc (``posenc time / variant time``, paired the same way)."""
    names = list(variants)
    timers = {
        n: benchmark.Timer("f()", globals={"f": variants[n]}, num_threads=threads)
        for n in names
    }
    calls = {}
    with torch.no_grad():
        for name in names:  # warm up, then size the blocks
            for _ in range(2):
                variants[name]()
            single = timers[name].timeit(1).mean
            calls[name] = max(1, round(block_s / max(single, 1e-7)))
        times: dict[str, list[float]] = {n: [] for n in names}
        rounds = paired_rounds(
            timers,
            calls,
            times,
            seconds=seconds,
            min_rounds=min_rounds,
            max_rounds=max_rounds,
        )
    baseline = names[0]

    def ratio(num: str, den: str) -> tuple[float, list[float]]:
        return paired_ratio(times, num, den)

    speedup = {n: ratio(baseline, n) for n in names[1:]}
    others = [n for n in names[1:] if n != "posenc" and not n.endswith("_sin_cos")]
    others = others if "posenc" in names else []
    return {
        "baseline": baseline,
        "threads": threads,
        "rounds": rounds,
        "calls_per_block": calls,
        "median_us": {
            n: round(statistics.median(t) * 1e6, 1) for n, t in times.items()
        },
        # baseline time / variant time, paired by round: > 1 = faster than diffusers
        "speedup": {n: v[0] for n, v in speedup.items()},
        "speedup_quartiles": {n: v[1] for n, v in speedup.items()},
        # posenc time / variant time, paired by round: > 1 = faster than posenc's road
        "speedup_over_posenc": {n: ratio("posenc", n)[0] for n in others},
        "ratios": {
            "float64_over_float32_trig": ratio("float64_sin_cos", "float32_sin_cos")[0]
        }
        if {"float64_sin_cos", "float32_sin_cos"} <= set(names)
        else {},
    }


def rows(groups: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per group: posenc's speedup over diffusers, with quartiles (what book/17_sincos_conventions prints)."""
    return [
        {
            "group": key,
            "name": GROUPS[key],
            "speedup": res["speedup"]["posenc"],
            "quartiles": res["speedup_quartiles"]["posenc"],
        }
        for key, res in groups.items()
    ]


def goals(table: list[dict[str, Any]], noise: float = 0.03) -> list[dict[str, Any]]:
    """The issue's goal: posenc not slower than diffusers on the CPU, in every row, within ``noise`` (a few per
    cent is the noise of a shared machine)."""
    return [
        {
            "goal": f"{row['name']}: not slower than diffusers",
            "value": row["speedup"],
            "met": row["speedup"] >= 1 - noise,
        }
        for row in table
    ]


def parse_threads(text: str) -> list[int]:
    """``"1,default"`` -> ``[1, torch.get_num_threads()]`` (each setting once, in order)."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        n = torch.get_num_threads() if item == "default" else int(item)
        if n < 1:
            raise ValueError(
                f"--threads takes positive ints or 'default', got {item!r}"
            )
        if n not in out:
            out.append(n)
    return out


def run(*, seconds: float, block_s: float, threads: list[int]) -> dict[str, Any]:
    start = time.perf_counter()
    load_before = _load_average()
    made = make_groups()
    ops = {
        key: {name: aten_ops(fn) for name, fn in variants.items()}
        for key, variants in made.items()
        if key.startswith("timestep")
    }
    runs = []
    for n in threads:
        load = _load_average()
        groups = {}
        for key, variants in made.items():
            groups[key] = time_group(
                variants, seconds=seconds, block_s=block_s, threads=n
            )
            print(f"{n} thread(s) {GROUPS[key]:45s} speedup over diffusers: "
                  + ", ".join(f"{v} {s:.2f}" for v, s in groups[key]["speedup"].items()),
                  file=sys.stderr, flush=True)  # fmt: skip
        table = rows(groups)
        runs.append(
            {
                "threads": n,
                "load_average": {"before": load, "after": _load_average()},
                "groups": groups,
                "rows": table,
                "float64_over_float32_trig": groups["timestep_distinct"]["ratios"][
                    "float64_over_float32_trig"
                ],
                "goals": goals(table),
            }
        )
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "device": "cpu",
        "machine": machine("cpu"),
        "versions": {
            "torch": torch.__version__,
            "diffusers": __import__("diffusers").__version__,
        },
        "allocator_env": ALLOCATOR_ENV if allocator_env_active() else None,
        "config": {
            "seconds_per_group": seconds,
            "block_s": block_s,
            "threads": threads,
            "batch": BATCH,
            "dim": DIM,
            "grid": list(GRID),
            "grid_dim": GRID_DIM,
        },
        "load_average": {"before": load_before, "after": _load_average()},
        "aten_ops": ops,
        "runs": runs,
        "wall_s": round(time.perf_counter() - start, 1),
    }


# ----------------------------------------------------------------------------------------------------------
# Peak memory of a table build
# ----------------------------------------------------------------------------------------------------------

#: Each case builds a table of 32 MiB (``setup`` runs before the measurement, ``call`` is measured).
MEMORY_CASES = {
    "timestep_bf16": ("t = torch.rand(16384) * 1000",
                      "timestep_embedding(t, 1024, dtype=torch.bfloat16)"),
    "timestep_float32": ("t = torch.rand(8192) * 1000", "timestep_embedding(t, 1024)"),
    "timestep_expanded_bf16": ("t = torch.tensor(500.0).expand(16384)",
                               "timestep_embedding(t, 1024, dtype=torch.bfloat16)"),
    "grid_2d_float32": ("", "sincos_grid((128, 128), 512)"),
    "grid_1d_bf16": ("", "sincos_grid((65536,), 256, dtype=torch.bfloat16)"),
    "detr_float32": ("mask = torch.zeros(2, 128, 128, dtype=torch.bool); mask[1, 64:] = True",
                     "detr_sine_encoding(mask, 128, normalize=True)"),
}  # fmt: skip
#: glibc returns freed blocks of 64 KiB or more to the system at once, so the resident set follows what torch
#: holds (the process's peak resident set is the measurement)
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}

_PEAK_SCRIPT = """
import json, sys
sys.path.insert(0, {path!r})
import torch
from posenc import detr_sine_encoding, sincos_grid, timestep_embedding

torch.set_num_threads(1)
torch.manual_seed(0)
{one_block}
timestep_embedding(torch.rand(4), 8, dtype=torch.bfloat16)  # load the kernels
sincos_grid((2, 2), 8), detr_sine_encoding(torch.zeros(1, 2, 2, dtype=torch.bool), 4)
{setup}


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024


open("/proc/self/clear_refs", "w").write("5")  # reset the peak resident set
base = status("VmRSS")
out = {call}
peak = status("VmHWM")
print(json.dumps({{"result_bytes": out.numel() * out.element_size(), "peak_bytes": peak - base}}))
"""


def peak_memory(
    setup: str, call: str, package: Path = ROOT, one_block: bool = False
) -> dict[str, Any]:
    """The growth of a fresh process's peak resident set while ``call`` runs (Linux), with the result's size:
    ``{"result_bytes", "peak_bytes", "ratio"}``; ``package``: the directory posenc is imported from;
    ``one_block``: build every table in one block (``posenc.sinusoidal.encoding.CHUNK_BYTES`` set beyond any table)."""
    import subprocess

    block = (
        "import posenc.sinusoidal.encoding; posenc.sinusoidal.encoding.CHUNK_BYTES = 2**62"
        if one_block
        else ""
    )
    script = _PEAK_SCRIPT.format(
        path=str(package), setup=setup, call=call, one_block=block
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        env={**os.environ, **MEMORY_ENV},
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["ratio"] = round(found["peak_bytes"] / found["result_bytes"], 3)
    return found


def memory_run(package: Path = ROOT) -> dict[str, Any]:
    """Every case of ``MEMORY_CASES``, measured once each in a fresh process, in chunks (posenc's build) and in
    one block (the float64 temporaries of the whole table at once)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    cases = {}
    for name, (setup, call) in MEMORY_CASES.items():
        chunked = peak_memory(setup, call, package)
        whole = peak_memory(setup, call, package, one_block=True)
        cases[name] = {"call": call, **chunked, "one_block": whole}
        print(f"{name:24s} peak {chunked['ratio']:.2f} x the result in chunks, "
              f"{whole['ratio']:.2f} x in one block", file=sys.stderr)  # fmt: skip
    return {
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "machine": machine("cpu"),
        "versions": {"torch": torch.__version__},
        "allocator_env": MEMORY_ENV,
        "cases": cases,
    }


def latest_memory_results(results: Path = RESULTS) -> dict[str, Any] | None:
    """The newest ``sincos-memory-<date>.json`` in ``results``, with its path under ``"file"``; ``None`` if none."""
    return latest_results("memory", results)


def latest_results(
    device: str = "cpu", results: Path = RESULTS
) -> dict[str, Any] | None:
    """The newest ``sincos-<device>-<date>.json`` in ``results`` (``device="memory"``: the memory run's), with
    its path (relative to the repository) under ``"file"``; ``None`` if there is none."""
    files = sorted(results.glob(f"sincos-{device}-*.json"))
    if not files:
        return None
    report = json.loads(files[-1].read_text())
    path = files[-1].resolve()
    report["file"] = (
        path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="seconds of interleaved rounds per group and thread setting")  # fmt: skip
    parser.add_argument("--block-ms", type=float, default=5.0,
                        help="duration of one variant's block in a round")  # fmt: skip
    parser.add_argument("--threads", default="1,default",
                        help="intra-op thread settings, e.g. '1,default' or '1,2,4'")  # fmt: skip
    parser.add_argument("--out", default=None,
                        help="results file, '-' for stdout; default: results/sincos-cpu-<date>.json")  # fmt: skip
    parser.add_argument("--no-allocator-env", action="store_true",
                        help="do not re-run with ALLOCATOR_ENV set")  # fmt: skip
    parser.add_argument("--memory", action="store_true",
                        help="measure peak memory instead -> results/sincos-memory-<date>.json")  # fmt: skip
    args = parser.parse_args(argv)
    if args.memory:
        report = memory_run()
        path = (
            Path(args.out)
            if args.out
            else RESULTS / f"sincos-memory-{report['date']}.json"
        )
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
        return 0
    threads = parse_threads(
        args.threads
    )  # before the re-execution: its default is this process's
    if not args.no_allocator_env and not allocator_env_active():
        # glibc reads these variables when the process starts: run again with them set (see benchmarks/bench.py)
        os.execve(
            sys.executable,
            [sys.executable, *sys.argv, "--threads", ",".join(map(str, threads))],
            {**os.environ, **ALLOCATOR_ENV},
        )
    report = run(seconds=args.seconds, block_s=args.block_ms / 1000, threads=threads)
    text = json.dumps(report, indent=1)
    if args.out == "-":
        print(text)
        return 0
    path = Path(args.out) if args.out else RESULTS / f"sincos-cpu-{report['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(f"wrote {path}", file=sys.stderr)
    for result in report["runs"]:
        for check in result["goals"]:
            mark = "met" if check["met"] else "NOT MET"
            print(f"  {result['threads']} thread(s) {check['goal']}: {check['value']:.3f} {mark}",
                  file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
