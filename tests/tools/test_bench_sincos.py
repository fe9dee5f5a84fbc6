"""benchmarks/bench_sincos.py: the variants compute the same embeddings (the measured alternatives within their
stated bounds, against mpmath over the whole range the angle-addition road takes), the timing method pairs its
ratios, the goal is read as documented, and the committed results files are the ones
book/17_sincos_conventions.ipynb reads.

No timed assertion: only that the numbers are produced, well formed, and judged by the stated rule.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from benchmarks import bench_sincos
from benchmarks.bench_sincos import (
    ANGLE_ADDITION_MAX,
    angle_addition_block,
    angle_addition_embedding,
    angle_addition_rows,
    angle_addition_tables,
    half_angle_embedding,
    into_output_embedding,
)
from posenc import timestep_embedding
from tests.references.exact import TIMESTEP_SETTINGS, exact_embedding

U = 2.0**-53
F64 = torch.float64


def test_variants_compute_the_same_embeddings():
    groups = bench_sincos.make_groups()
    assert set(groups) == set(bench_sincos.GROUPS)
    for key, variants in groups.items():
        assert next(iter(variants)) == "diffusers"  # the baseline comes first
        theirs, ours = variants["diffusers"](), variants["posenc"]()
        assert (
            ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
        )
        # diffusers' float32 time steps drift by up to ~1e-4 near t = 1000; its grid is float64
        tolerance = 1e-6 if key == "grid" else 1e-3
        torch.testing.assert_close(ours, theirs, rtol=0, atol=tolerance)
    distinct, integer = groups["timestep_distinct"], groups["timestep_integer"]
    # fewer passes, the same values; a table made once, the same rows
    assert torch.equal(distinct["into_output"](), distinct["posenc"]())
    assert torch.equal(integer["table_lookup"](), integer["posenc"]())
    # angle addition: the complete road and its arithmetic alone give the same bits; within one float32 ulp
    # (<= 2^-24) of posenc's direct road, both being within 2^-24 of the exact values
    road, arithmetic = (
        integer["angle_addition"](),
        integer["angle_addition_arithmetic"](),
    )
    assert torch.equal(road, arithmetic) and road.dtype == torch.float32
    assert (road.double() - integer["posenc"]().double()).abs().max() <= 2**-24
    # one tangent per angle: within one float32 ulp of posenc's road (both within 2^-24 of the exact values)
    half = distinct["half_angle"]()
    assert half.dtype == torch.float32 and half.shape == distinct["posenc"]().shape
    assert (half.double() - distinct["posenc"]().double()).abs().max() <= 2**-24
    tan64 = distinct["float64_tan"]()
    assert tan64.dtype == F64 and tan64.shape == (
        bench_sincos.BATCH,
        bench_sincos.DIM // 2,
    )
    trig64 = distinct["float64_sin_cos"]()
    trig32 = distinct["float32_sin_cos"]()
    for x64, x32 in zip(trig64, trig32):  # sin, cos
        assert x64.dtype == torch.float64 and x32.dtype == torch.float32
        assert x64.shape == x32.shape == (bench_sincos.BATCH, bench_sincos.DIM // 2)
        torch.testing.assert_close(x32.double(), x64, rtol=0, atol=1e-3)


@pytest.mark.parametrize(("flip", "shift"), TIMESTEP_SETTINGS)
@pytest.mark.parametrize("dim", [320, 7])
def test_fewer_passes_give_the_same_bits(flip, shift, dim):
    t = torch.cat([torch.rand(50) * 1000, torch.arange(0, 1000, 37).float()])
    kw = {"flip_sin_to_cos": flip, "downscale_freq_shift": shift}
    assert torch.equal(
        into_output_embedding(t, dim, **kw), timestep_embedding(t, dim, **kw)
    )


@pytest.mark.parametrize(("flip", "shift"), TIMESTEP_SETTINGS)
@pytest.mark.parametrize("dim", [320, 7, 33])
def test_one_tangent_per_angle_is_within_2_to_minus_24_of_the_exact_values(
    flip, shift, dim
):
    torch.manual_seed(dim)
    edges = torch.tensor([0.0, 0.5, 1.0, 999.0, 999.5, 2.0**20 + 0.25, 2.0**24 - 1])
    t = torch.cat([edges, torch.rand(16) * 1000, torch.rand(8) * 2**24])
    kw = {"flip_sin_to_cos": flip, "downscale_freq_shift": shift}
    ours = half_angle_embedding(t, dim, **kw)
    assert ours.dtype == torch.float32 and ours.shape == (len(t), dim)
    exact = exact_embedding(t, dim, flip, shift, 1.0, 1e4)
    assert (ours.double() - exact).abs().max() <= 2**-24
    if dim % 2:
        assert torch.equal(ours[:, -1], torch.zeros(len(t)))
    with pytest.raises(ValueError, match="timesteps must be finite and >= 0"):
        half_angle_embedding(torch.tensor([1.0, -1.0]), dim, **kw)  # posenc's checks


# ----------------------------------------------------------------------------------------------------------
# The angle-addition road: its bound, over the whole range it takes
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t_max", [0, 1, 999, 2**16 + 7, ANGLE_ADDITION_MAX])
@pytest.mark.parametrize(
    ("flip", "shift", "dim"), [(False, 1.0, 64), (True, 0.0, 7), (False, 0.5, 33)]
)
def test_angle_addition_is_within_its_bound_of_the_exact_values(
    t_max, flip, shift, dim
):
    block = angle_addition_block(t_max)
    assert block * block > t_max  # so a = t // B and b = t % B are both < B
    torch.manual_seed(t_max + dim)
    edges = torch.tensor([0, 1, block - 1, block, block + 1, t_max - 1, t_max])
    t = torch.cat([edges.clamp(0, t_max), torch.randint(0, t_max + 1, (24,))])
    tables = angle_addition_tables(dim // 2, shift, 1e4, block, flip)
    assert tables.shape == (block, 2, dim // 2) and tables.dtype == torch.complex128
    exact = exact_embedding(t, dim, flip, shift, 1.0, 1e4)
    a, b = t // block, t % block
    # the chapter's bound: u (4 t + 6 (a + b) + 3); the direct road's: u (4 t + 2)
    bound = U * (4 * t.double() + 6 * (a + b).double() + 3)
    ours64 = angle_addition_rows(t, tables, dim, F64)
    assert ((ours64 - exact).abs() <= bound[:, None]).all()
    direct = timestep_embedding(
        t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift, dtype=F64
    )
    assert ((direct - exact).abs() <= U * (4 * t.double()[:, None] + 2)).all()
    # so float32 is within 2^-24 of the exact values, like posenc's
    ours32 = angle_addition_rows(t, tables, dim, torch.float32)
    assert ours32.dtype == torch.float32
    assert (ours32.double() - exact).abs().max() <= 2**-24
    if dim % 2:
        assert torch.equal(ours32[:, -1], torch.zeros(len(t)))


@pytest.mark.parametrize(("flip", "shift"), TIMESTEP_SETTINGS)
def test_angle_addition_agrees_with_the_direct_road_at_every_step_below_10000(
    flip, shift
):
    t = torch.arange(10_000)
    block = angle_addition_block(9_999)
    tables = angle_addition_tables(160, shift, 1e4, block, flip)
    kw = {"flip_sin_to_cos": flip, "downscale_freq_shift": shift}
    a, b = t // block, t % block
    # each road within its bound of the rotation by t ω̂ (the same frequencies):
    # u (t + 6 (a + b) + 3) and u (t + 2), so within their sum of each other
    gap = U * (2 * t.double() + 6 * (a + b).double() + 5)
    ours = angle_addition_rows(t, tables, 320, F64)
    direct = timestep_embedding(t, 320, **kw, dtype=F64)
    assert ((ours - direct).abs() <= gap[:, None]).all()
    diff32 = angle_addition_rows(t, tables, 320, torch.float32).double()
    assert (diff32 - timestep_embedding(t, 320, **kw).double()).abs().max() <= 2**-24


def test_angle_addition_takes_its_road_only_where_stated():
    torch.manual_seed(0)
    t = torch.randint(0, 1000, (256,))
    for kw in ({}, {"flip_sin_to_cos": True, "downscale_freq_shift": 0}):
        tables = angle_addition_tables(
            160, kw.get("downscale_freq_shift", 1.0), 1e4, 32, bool(kw)
        )
        road = angle_addition_embedding(t, 320, **kw)
        assert torch.equal(road, angle_addition_rows(t, tables, 320, torch.float32))
        assert torch.equal(
            angle_addition_embedding(t.int(), 320, **kw, dtype=F64),
            angle_addition_rows(t, tables, 320, F64),
        )
    zeros = torch.zeros(4, dtype=torch.int64)  # t = 0 only: B = 1, one row per table
    expected = torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0]).expand(
        4, 9
    )  # sin 0, cos 0, 0
    assert torch.equal(angle_addition_embedding(zeros, 9), expected)
    assert torch.equal(timestep_embedding(zeros, 9), expected)
    # elsewhere it is posenc, bitwise
    elsewhere = {
        "float time steps": (t.float(), {}),
        "a small batch (2 B > N)": (t[:40], {}),
        "beyond its range": (torch.tensor([0, ANGLE_ADDITION_MAX + 1] * 5000), {}),
        "an expanded time step": (torch.tensor(7).expand(300), {}),
        "float16 output": (t, {"dtype": torch.float16}),
        "bfloat16 output": (t, {"dtype": torch.bfloat16}),
    }
    for name, (steps, kw) in elsewhere.items():
        assert torch.equal(
            angle_addition_embedding(steps, 64, **kw),
            timestep_embedding(steps, 64, **kw),
        ), name
    with pytest.raises(ValueError, match="timesteps must be finite and >= 0"):
        angle_addition_embedding(torch.tensor([3, -1] * 200), 64)
    with pytest.raises(ValueError, match="dim // 2 - downscale_freq_shift"):
        angle_addition_embedding(t, 2)


# ----------------------------------------------------------------------------------------------------------
# The timing method and the results file
# ----------------------------------------------------------------------------------------------------------


def test_time_group_reports_paired_ratios():
    calls = {"a": 0, "posenc": 0, "b": 0}

    def variant(name):
        def run():
            calls[name] += 1
            return torch.zeros(4).sin()

        return run

    res = bench_sincos.time_group(
        {name: variant(name) for name in calls},
        seconds=0.0,
        block_s=1e-4,
        threads=1,
        min_rounds=5,
        max_rounds=5,
    )
    assert res["baseline"] == "a" and res["rounds"] == 5 and res["threads"] == 1
    assert set(res["speedup"]) == {"posenc", "b"} and res["ratios"] == {}
    assert set(res["speedup_over_posenc"]) == {"b"}
    low, high = res["speedup_quartiles"]["b"]
    assert 0 < low <= res["speedup"]["b"] <= high
    assert calls["a"] >= 5 * res["calls_per_block"]["a"]


def test_goal_allows_three_percent():
    table = [
        {"name": "x", "speedup": 0.975, "quartiles": [0.9, 1.0]},
        {"name": "y", "speedup": 0.96, "quartiles": [0.9, 1.0]},
    ]
    assert [g["met"] for g in bench_sincos.goals(table)] == [True, False]


def test_thread_settings_and_op_counts():
    # repeats dropped: on a one-thread machine (or OMP_NUM_THREADS=1) "default" is 1 as well
    expected = list(dict.fromkeys([1, torch.get_num_threads()]))
    assert bench_sincos.parse_threads("1,default,1") == expected
    assert bench_sincos.parse_threads("2, 4") == [2, 4]
    with pytest.raises(ValueError, match="--threads"):
        bench_sincos.parse_threads("0")
    x = torch.zeros(3)
    assert bench_sincos.aten_ops(lambda: x.sin().cos()) == 2


def test_the_committed_results_are_what_the_chapter_reads():
    results = bench_sincos.latest_results("cpu")
    assert results is not None, "run benchmarks/bench_sincos.py and commit its results"
    assert results["file"].startswith("benchmarks/results/sincos-cpu-")
    assert results["allocator_env"] == bench_sincos.ALLOCATOR_ENV
    threads = [run["threads"] for run in results["runs"]]
    assert threads == results["config"]["threads"] and threads[0] == 1
    assert len(threads) >= 2  # one thread and the default: both reported
    for run in results["runs"]:
        assert [row["group"] for row in run["rows"]] == list(bench_sincos.GROUPS)
        for row in run["rows"]:
            low, high = row["quartiles"]
            assert 0 < low <= row["speedup"] <= high
        assert run["float64_over_float32_trig"] > 1
        assert len(run["goals"]) == len(run["rows"])
        assert set(run["groups"]["timestep_integer"]["speedup_over_posenc"]) == {
            "angle_addition", "angle_addition_arithmetic", "table_lookup",
        }  # fmt: skip
    ops = results["aten_ops"]
    assert set(ops) == {"timestep_distinct", "timestep_integer", "timestep_expanded"}
    assert all(n > 0 for group in ops.values() for n in group.values())


def test_the_chapter_s_sentences_agree_with_the_committed_results():
    # book/17_sincos_conventions.ipynb, "Speed"
    results = bench_sincos.latest_results("cpu")
    one = results["runs"][0]
    speedup = {row["group"]: row["speedup"] for row in one["rows"]}
    groups = one["groups"]
    # one thread: slower for distinct and integer time steps and the module (goal not met), faster for an
    # expanded time step, many times faster for the grid
    assert speedup["timestep_distinct"] < 0.97 and speedup["module"] < 0.97
    assert speedup["timestep_integer"] < 0.97
    assert speedup["timestep_expanded"] > 1.03
    assert speedup["grid"] > 3
    # "the float64 sines and cosines alone are slower than diffusers' whole call": no direct road can meet it
    assert groups["timestep_distinct"]["speedup"]["float64_sin_cos"] < 0.97
    # "one tangent per angle costs about as much as a sine and a cosine": the tangent alone is slower than
    # diffusers' whole call, and the road built on it is not faster than diffusers
    assert groups["timestep_distinct"]["speedup"]["float64_tan"] < 0.97
    distinct = groups["timestep_distinct"]["speedup"]
    assert (
        0.75 < distinct["float64_sin_cos"] / distinct["float64_tan"] < 1.35
    )  # tan time / sin-and-cos time
    assert groups["timestep_distinct"]["speedup"]["half_angle"] < 0.97
    # "fewer passes gain nothing worth a second road" (within 10 % of posenc's)
    assert 0.9 < groups["timestep_distinct"]["speedup_over_posenc"]["into_output"] < 1.1
    # angle addition: faster than posenc's road, slower than diffusers; its arithmetic alone is faster than
    # diffusers, and it dispatches more ATen operations than either
    integer = groups["timestep_integer"]
    assert integer["speedup_over_posenc"]["angle_addition"] > 1
    assert integer["speedup"]["angle_addition"] < 0.97
    assert integer["speedup"]["angle_addition_arithmetic"] > 1.03
    ops = results["aten_ops"]["timestep_integer"]
    assert ops["angle_addition"] > 2 * max(ops["diffusers"], ops["posenc"])
    # a table made once and indexed is more than twice as fast as diffusers
    assert integer["speedup"]["table_lookup"] > 2
    assert angle_addition_block(999) == 32  # "B = 32 for DDPM's 1,000 steps"
    # eq-ts-angle-bound at the top of the road's range: "about a quarter of 2^-25"
    block = angle_addition_block(ANGLE_ADDITION_MAX)
    bound = U * (4 * ANGLE_ADDITION_MAX + 6 * 2 * (block - 1) + 3)
    assert 0.24 < bound / 2**-25 < 0.26
    # default threads: both libraries' per-call medians "mostly shorter than at one thread (median ratio below
    # 1)", and "every row's ratio on the same side of 1 as at one thread"
    for run in results["runs"][1:]:
        for row, first in zip(run["rows"], one["rows"]):
            assert (row["speedup"] > 1) == (first["speedup"] > 1), row["group"]
    swing = [
        run["groups"][g]["median_us"][side] / one["groups"][g]["median_us"][side]
        for run in results["runs"][1:]
        for g in bench_sincos.GROUPS
        for side in ("diffusers", "posenc")
    ]
    assert statistics.median(swing) < 1


def test_the_committed_memory_results_are_what_the_reference_page_says():
    # book/17_sincos_conventions.ipynb, "Memory": every build within 1.5 times its result in chunks; in one block a
    # bfloat16 table of distinct rows above ten times, a float32 one several times; the expanded time step and the
    # 2-D grid (computed from a few distinct rows) within 1.05 times either way
    memory = bench_sincos.latest_memory_results()
    assert memory is not None, (
        "run benchmarks/bench_sincos.py --memory and commit its results"
    )
    assert memory["file"].startswith("benchmarks/results/sincos-memory-")
    assert memory["allocator_env"] == bench_sincos.MEMORY_ENV
    assert set(memory["cases"]) == set(bench_sincos.MEMORY_CASES)
    for name, case in memory["cases"].items():
        assert case["result_bytes"] == 32 * 2**20, name
        assert 1 <= case["ratio"] <= 1.5, name
    one_block = {
        name: case["one_block"]["ratio"] for name, case in memory["cases"].items()
    }
    assert one_block["timestep_bf16"] > 10 and one_block["grid_1d_bf16"] > 10
    assert one_block["timestep_float32"] > 3 and one_block["detr_float32"] > 3
    assert one_block["timestep_expanded_bf16"] <= 1.05
    assert one_block["grid_2d_float32"] <= 1.05
