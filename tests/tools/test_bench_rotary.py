"""benchmarks/bench_rotary.py: the timing method runs, its variants agree, and the goals are read as documented.

No timed assertion: only that the numbers are produced, well formed, and judged by the stated rule.
"""

from __future__ import annotations

import torch

from benchmarks import bench_rotary


def test_variants_rotate_alike_and_move_the_stated_bytes():
    variants, moved = bench_rotary.make_variants(
        (1, 4, 3, 16), 5, torch.device("cpu"), compiled=False
    )
    with torch.no_grad():
        # each posenc variant against transformers with the same settings; posenc's exact
        # tables differ from transformers' float32 angles by rounding
        for hf, names in (
            ("hf", ("hf_with_tables", "posenc", "posenc_apply")),
            ("hf_llama3", ("posenc_llama3",)),
            ("hf_mrope", ("posenc_mrope",)),
        ):
            hf_q, hf_k = variants[hf]()
            for name in names:
                q, k = variants[name]()
                torch.testing.assert_close(q, hf_q, rtol=0, atol=1e-5)
                torch.testing.assert_close(k, hf_k, rtol=0, atol=1e-5)
        # llama3 scaling and M-RoPE positions really change the rotation
        assert not torch.allclose(
            variants["posenc_llama3"]()[0], variants["posenc"]()[0]
        )
        assert not torch.allclose(
            variants["posenc_mrope"]()[0], variants["posenc"]()[0]
        )
    # read q, k (4 bytes each) and two table rows; write two outputs
    assert set(moved.values()) == {2 * 2 * 1 * 4 * 3 * 16 * 4 + 2 * 3 * 16 * 4}


def test_mrope_positions_are_text_then_an_image_grid():
    p = bench_rotary.mrope_positions(40, 0, torch.device("cpu"))
    assert p.shape == (3, 1, 40)
    assert torch.equal(p[0, 0, :10], torch.arange(10)) and torch.equal(
        p[:, 0, :10], p[:1, 0, :10].expand(3, -1)
    )
    image = p[:, 0, 10:26]  # a 4 x 4 grid at time 10
    assert (image[0] == 10).all() and torch.equal(
        image[1], 10 + torch.arange(4).repeat_interleave(4)
    )
    assert torch.equal(image[2], 10 + torch.arange(4).repeat(4))
    assert (bench_rotary.mrope_positions(1, 2047, torch.device("cpu")) == 2047).all()


def test_time_shape_reports_paired_ratios():
    res = bench_rotary.time_shape(
        (1, 2, 1, 16), 7, torch.device("cpu"), seconds=0.0, block_s=2e-4,
        compiled=False, min_rounds=5, max_rounds=5,
    )  # fmt: skip
    assert res["rounds"] == 5 and res["first_position"] == 7
    assert set(res["speedup_over_hf"]) == {
        "roofline_copy", "hf_with_tables", "posenc", "posenc_apply",
        "hf_llama3", "posenc_llama3", "hf_mrope", "posenc_mrope",
    }  # fmt: skip
    assert set(res["speedup_over_hf_same_scaling"]) == {"posenc_llama3", "posenc_mrope"}
    for name, value in res["speedup_over_hf"].items():
        low, high = res["speedup_over_hf_quartiles"][name]
        assert 0 < low <= value <= high
    assert res["speedup_over_hf_compiled"] == {}


def test_before_after_times_a_git_revision_beside_the_working_tree():
    out = bench_rotary.time_before_after(
        "HEAD", torch.device("cpu"), seconds=0.0, block_s=2e-4,
        shapes={(1, 2, 1, 16): (7, "tiny"), (1, 2, 5, 16): (0, "tiny")}, min_rounds=5,
    )  # fmt: skip
    assert out["revision"] == "HEAD" and len(out["revision_commit"]) == 40
    for res in out["results"]:
        assert res["rounds"] == 5 and set(res["before_over_after"]) == {
            "module",
            "apply",
        }
        for name, value in res["before_over_after"].items():
            low, high = res["before_over_after_quartiles"][name]
            assert 0 < low <= value <= high
        assert isinstance(res["bitwise_equal"], bool)


def _result(eager: float, compiled: float, scaled: float = 1.2) -> dict:
    return {
        "device": "cpu",
        "shape": [1, 32, 1, 128],
        "speedup_over_hf": {"posenc": eager, "posenc_apply": eager, "hf_compiled": 9.0},
        "speedup_over_hf_same_scaling": {
            "posenc_llama3": scaled,
            "posenc_mrope": scaled,
        },
        "speedup_over_hf_compiled": {
            "posenc_compiled": compiled,
            "posenc_apply_compiled": compiled,
            "posenc_compiled_module": 0.5,  # reported, not a goal
        },
    }


def test_goals_allow_three_percent_and_pair_like_with_like():
    met = bench_rotary.goals([_result(0.975, 1.4)])
    assert [g["goal"].split()[0] for g in met] == [
        "posenc", "posenc_apply", "posenc_llama3", "posenc_mrope", "posenc_compiled", "posenc_apply_compiled"
    ]  # fmt: skip
    assert all(g["met"] for g in met)
    assert [g["value"] for g in met] == [0.975, 0.975, 1.2, 1.2, 1.4, 1.4]  # paired
    assert "hf_llama3 eager" in met[2]["goal"] and "hf_mrope eager" in met[3]["goal"]
    missed = bench_rotary.goals([_result(0.965, 0.9, 0.96)])
    assert not any(g["met"] for g in missed)
    eager_only = _result(1.1, 1.0)
    del eager_only["speedup_over_hf_compiled"]
    assert len(bench_rotary.goals([eager_only])) == 4


def test_the_swap_variants_agree_and_time_shape_reports_paired_speedups():
    variants = bench_rotary.make_swap_variants(torch.device("cpu"), tokens=6)
    with torch.no_grad():
        hf, ours = variants["hf_prefill"]().logits, variants["posenc_prefill"]().logits
        torch.testing.assert_close(ours, hf, rtol=0, atol=1e-4 * hf.abs().max().item())
        for case in ("decode", "module_prefill", "module_decode"):
            a, b = variants[f"hf_{case}"](), variants[f"posenc_{case}"]()
            a, b = (a.logits, b.logits) if case == "decode" else (a[0], b[0])
            torch.testing.assert_close(
                b, a, rtol=0, atol=1e-4 * max(1.0, a.abs().max().item())
            )
        # the decoding step keeps its cache at the prompt's length: every call is the same call
        first = variants["posenc_decode"]().logits
        assert torch.equal(variants["posenc_decode"]().logits, first)
    res = bench_rotary.time_swap(
        torch.device("cpu"),
        seconds=0.0,
        block_s=2e-4,
        min_rounds=3,
        max_rounds=3,
        tokens=6,
    )
    assert res["rounds"] == 3
    assert set(res["speedup"]) == {
        "prefill",
        "decode",
        "module_prefill",
        "module_decode",
    }
    assert all(v > 0 for v in res["speedup"].values())
    checks = bench_rotary.swap_goals(res)
    assert [c["met"] for c in checks] == [
        res["speedup"][c] >= 0.97 for c in ("prefill", "decode")
    ]


def test_the_core_variants_rotate_alike_in_every_dtype():
    for dtype in bench_rotary.CORE_DTYPES:
        variants = bench_rotary.make_core_variants(
            (1, 2, 3, 16), 5, torch.device("cpu"), dtype
        )
        with torch.no_grad():
            want = [t.double() for t in variants["minimal"]()]
            names = ("hf", "posenc", "posenc_each")
            for name in names if dtype != torch.float32 else names[:2]:
                got = variants[name]()
                assert all(t.dtype == dtype for t in got)
                # posenc rounds its float32 result once; the others round each step
                tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps * 4
                for a, b in zip(got, want):
                    torch.testing.assert_close(a.double(), b, rtol=0, atol=tol)


def test_core_goals_are_read_as_documented():
    def result(dtype, seq_len, minimal, hf, each=None):
        ratio = {"minimal": minimal, "hf": hf}
        ratio |= {"hf_over_each": each} if each is not None else {}
        return {
            "device": "cpu", "shape": [1, 2, seq_len, 16], "dtype": dtype,
            "over_posenc": ratio,
        }  # fmt: skip

    checks = bench_rotary.core_goals([
        result("float32", 1, 0.92, 0.98),  # decoding: both goals met
        result("float32", 2048, 0.5, 0.5),  # float32 prefill: no goal
        result("bfloat16", 2048, 0.3, 0.49, 0.89),  # "each": 0.9 of transformers'
    ])  # fmt: skip
    assert [(c["dtype"], c["met"]) for c in checks] == [
        ("float32", True), ("float32", True), ("bfloat16", False),
    ]  # fmt: skip
    missed = bench_rotary.core_goals([result("float32", 1, 0.90, 0.96)])
    assert [c["met"] for c in missed] == [False, False]
