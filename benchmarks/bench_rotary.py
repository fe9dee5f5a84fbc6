"""Benchmark posenc's rotary embeddings against Hugging Face transformers and a copy roofline.

    python benchmarks/bench_rotary.py                  # CPU, eager and torch.compile -> results/rotary-cpu-<date>.json
    python benchmarks/bench_rotary.py --no-compiled    # eager only (compiling takes minutes on a small CPU)
    python benchmarks/bench_rotary.py --before 4a91582 # also: the code at that git revision, paired by round
    python benchmarks/bench_rotary.py --device cuda    # on a GPU -> results/rotary-gpu-<date>.json
    python benchmarks/bench_rotary.py --swap-only      # the Llama swap alone -> results/rotary-swap-cpu-<date>.json
    python benchmarks/bench_rotary.py --core-only      # the plain core alone -> results/rotary-core-cpu-<date>.json

Needs transformers (the real package, as pinned in requirements.txt); tools/gpu_check.py skips this benchmark,
saying so, where it is not installed.

Shapes (float32, q and k both ``[batch, heads, seq_len, head_dim]``, the "half" layout of Hugging Face):

- ``(1, 32, 2048, 128)``: a prefill of 2,048 tokens (32 MB per tensor);
- ``(1, 32, 1, 128)``: one decoding step at position 2,047 (per-call overhead).

Variants, all rotating q and k at the same positions:

- ``hf``: transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` with ``LlamaRotaryEmbedding``'s tables computed
  once outside the timed call (a model computes them once per forward and shares them across layers);
- ``hf_with_tables``: the same plus the table computation (``LlamaRotaryEmbedding.forward``) in every call;
- ``posenc``: ``RotaryEmbedding(128, layout="half")(q, k, offset=...)``, the cached table sliced;
- ``posenc_apply``: ``apply_rotary(q, cos=cos, sin=sin, layout="half")`` and the same for k, tables precomputed
  (``posenc_apply_compiled``: that function compiled);
- ``hf_llama3`` / ``posenc_llama3``: the same as ``hf`` / ``posenc`` with Llama 3.1's ``rope_parameters``;
- ``hf_mrope`` / ``posenc_mrope``: Qwen2-VL's M-RoPE (``mrope_section=[16, 24, 24]``, base 1e6) with positions
  ``[3, batch, seq]`` (text, then an image grid): transformers' ``Qwen2VLRotaryEmbedding(x, position_ids)`` and
  ``apply_rotary_pos_emb`` in every call, against ``RotaryEmbedding(..., scaling=...)(q, k, positions=...)``;
  each computes its tables from the positions in the call, as a model does once per forward;
- with ``--compiled`` (default): ``torch.compile(fullgraph=True)`` of ``hf`` and of a function of (q, k) calling
  the ``posenc`` module (``posenc_compiled``: how a compiled model runs it, the module inlined in its graph); and
  ``posenc_compiled_module``, ``torch.compile`` of the module object itself, whose call goes through the wrapper
  module's own ``__call__`` as well (reported, not a goal).

The plain core (``core`` in the results, and ``--core-only``): in float32, bfloat16 and float16 at both shapes,
``minimal`` (``x * cos + rotate_half(x) * sin`` on tables precomputed in the inputs' dtype), transformers'
``apply_rotary_pos_emb`` on the same tables, and ``RotaryEmbedding``, paired by round (``over_posenc`` = variant
time / posenc time, > 1: posenc faster).

The swap (``swap`` in the results, and ``--swap-only``): a whole forward of a small Llama (``SWAP_CONFIG``: 2 layers,
hidden size 256, 4 heads of 64 channels, 512 tokens of vocabulary, eager, float32) with transformers' own
``LlamaRotaryEmbedding`` against the same model with ``posenc.HFRotaryEmbedding`` swapped in (two models, the same
weights), paired by round: a prefill of 256 tokens, and one decoding step at position 256 with the KV cache (cropped
back to 256 tokens after each call, on both sides); and the rotary modules alone on the same position_ids.
``speedup`` is hf time / posenc time: > 1 means the swapped model is faster. The model is small so that the rotary
module's share of a forward is visible; in a larger model it shrinks.

Roofline: the time of a plain copy (``torch.clone``) of q, k and the table rows the call reads, measured in the same
rounds: the bytes any rotation must move, at the copy bandwidth achieved on this machine. A rotation that reads
q, k and the tables once and writes two outputs moves the same bytes as that copy, so ``ratio = copy time /
variant time`` is at most about 1.

``--before REV``: posenc as it was at git revision REV (``git show REV:posenc/...``, loaded under another package
name) is timed beside the working tree's, module and function, in the same rounds at both shapes: the paired
before/after ratios of a change (``before_after`` in the results file).

Method (as benchmarks/bench.py): short interleaved rounds, each timing one block (about 2 ms of calls) of every
variant in a rotated order; ratios are taken within each round and reported as medians over the rounds with their
quartiles, so load from other processes hits both sides of a ratio alike (the load average before and after is
recorded). One intra-op thread on CPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from benchmarks.bench import (  # noqa: E402
    ALLOCATOR_ENV,
    _load_average,
    allocator_env_active,
    machine,
    paired_ratio,
    paired_rounds,
)
from posenc import RotaryEmbedding, apply_rotary, rotary_cos_sin  # noqa: E402
from tests.references.rotary_peers import LLAMA31, hf_rotary_embedding  # noqa: E402

#: Qwen2-VL's rope_scaling (config.json), with its rope_theta
QWEN2_VL = {"type": "mrope", "mrope_section": [16, 24, 24]}
QWEN2_VL_BASE = 1e6


def qwen2_vl_scaling(head_dim: int) -> dict[str, Any]:
    """``QWEN2_VL`` for a head of ``head_dim`` channels: its split ([16, 24, 24] of 64 pairs) scaled."""
    pairs = head_dim // 2
    time_axis = pairs // 4
    height = (pairs - time_axis) // 2
    return {
        **QWEN2_VL,
        "mrope_section": [time_axis, height, pairs - time_axis - height],
    }


def _hf_apply() -> Callable[..., Any]:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def mrope_positions(seq_len: int, offset: int, device: torch.device) -> torch.Tensor:
    """Qwen2-VL-style positions ``[3, 1, seq_len]``: a quarter of text, then a square image grid (time fixed,
    height and width counting from where the text ended), then text again; a decoding step is one text token at
    ``offset`` on all three axes."""
    if seq_len == 1:
        return torch.full((3, 1, 1), offset, device=device)
    text = seq_len // 4
    side = math.isqrt(seq_len // 2)
    rows = torch.arange(side, device=device).repeat_interleave(side)
    cols = torch.arange(side, device=device).repeat(side)
    image = torch.stack([torch.full_like(rows, text), text + rows, text + cols])
    rest = seq_len - text - side * side
    start = text + side
    tail = torch.arange(start, start + rest, device=device).expand(3, -1)
    head = torch.arange(text, device=device).expand(3, -1)
    return torch.cat([head, image, tail], 1)[:, None] + offset


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
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    apply_rotary_pos_emb = _hf_apply()
    batch, _, seq_len, head_dim = shape
    torch.manual_seed(0)
    q = torch.randn(shape, device=device)
    k = torch.randn(shape, device=device)
    position_ids = torch.arange(offset, offset + seq_len, device=device).expand(
        batch, -1
    )
    hf_rope = hf_rotary_embedding(head_dim).to(device)
    cos, sin = hf_rope(q, position_ids)  # [batch, seq_len, head_dim] float32
    rope = RotaryEmbedding(head_dim, layout="half", max_len=4096).to(device)
    rope(q, k, offset=offset)  # fill the cache
    table_rows = (cos[0], sin[0])  # [seq_len, head_dim]
    # Llama 3.1 scaling: transformers' tables once per forward; posenc's cached table
    hf_llama3 = hf_rotary_embedding(head_dim, LLAMA31, 131072).to(device)
    cos3, sin3 = hf_llama3(q, position_ids)
    rope3 = RotaryEmbedding(head_dim, layout="half", scaling=LLAMA31).to(device)
    rope3(q, k, offset=offset)
    # Qwen2-VL M-RoPE: tables from the positions of the call, on both sides
    text = Qwen2VLConfig(text_config={
        "hidden_size": 4 * head_dim, "num_attention_heads": 4, "num_key_value_heads": 4,
        "rope_theta": QWEN2_VL_BASE, "rope_scaling": qwen2_vl_scaling(head_dim),
    }).text_config  # fmt: skip
    hf_mrope = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(text).to(device)
    rope_m = RotaryEmbedding(
        head_dim, layout="half", base=QWEN2_VL_BASE, scaling=qwen2_vl_scaling(head_dim)
    ).to(device)
    positions3 = mrope_positions(seq_len, offset, device).expand(3, batch, -1)

    def copy() -> None:
        q.clone(), k.clone(), table_rows[0].clone(), table_rows[1].clone()

    def hf_with_tables() -> Any:
        c, s = hf_rope(q, position_ids)
        return apply_rotary_pos_emb(q, k, c, s)

    def posenc_apply() -> Any:
        kw = {"cos": table_rows[0], "sin": table_rows[1], "layout": "half"}
        return apply_rotary(q, **kw), apply_rotary(k, **kw)

    def hf_mrope_call() -> Any:
        c, s = hf_mrope(q, positions3)
        return modeling_qwen2_vl.apply_rotary_pos_emb(q, k, c, s)

    variants: dict[str, Callable[[], Any]] = {
        "roofline_copy": copy,
        "hf": lambda: apply_rotary_pos_emb(q, k, cos, sin),
        "hf_with_tables": hf_with_tables,
        "posenc": lambda: rope(q, k, offset=offset),
        "posenc_apply": posenc_apply,
        "hf_llama3": lambda: apply_rotary_pos_emb(q, k, cos3, sin3),
        "posenc_llama3": lambda: rope3(q, k, offset=offset),
        "hf_mrope": hf_mrope_call,
        "posenc_mrope": lambda: rope_m(q, k, positions=positions3),
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
        hf_c = torch.compile(apply_rotary_pos_emb, fullgraph=True, dynamic=False)
        variants["posenc_compiled"] = lambda: rope_c(q, k)
        variants["posenc_compiled_module"] = lambda: module_c(q, k, offset=offset)
        variants["posenc_apply_compiled"] = lambda: apply_c(q, k, *table_rows)
        variants["hf_compiled"] = lambda: hf_c(q, k, cos, sin)
    nbytes = 2 * 2 * q.numel() * q.element_size() + 2 * seq_len * head_dim * 4
    return variants, dict.fromkeys(variants, nbytes)


def time_rounds(
    variants: dict[str, Callable[[], Any]],
    device: torch.device,
    *,
    seconds: float,
    block_s: float,
    min_rounds: int = 15,
    max_rounds: int = 400,
) -> tuple[dict[str, list[float]], dict[str, int], dict[str, float], int]:
    """Interleaved rounds of every variant (order rotated each round): per-call times per round, the calls per
    block, the warm-up seconds and the number of rounds."""
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
            once = max(timers[name].timeit(1).mean, 1e-7)
            single = timers[name].timeit(max(1, min(100, int(block_s / once)))).mean
            calls[name] = max(1, round(block_s / single))
        rounds = paired_rounds(
            timers,
            calls,
            times,
            seconds=seconds,
            min_rounds=min_rounds,
            max_rounds=max_rounds,
        )
    return times, calls, warmup_s, rounds


paired = paired_ratio


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
    times, calls, warmup_s, rounds = time_rounds(
        variants, device, seconds=seconds, block_s=block_s,
        min_rounds=min_rounds, max_rounds=max_rounds,
    )  # fmt: skip

    ratio = {n: paired(times, "roofline_copy", n) for n in names}
    speedup = {n: paired(times, "hf", n) for n in names if n != "hf"}
    # each scaled posenc variant against the same scaling in transformers, paired by round
    speedup_scaled = {
        n: paired(times, n.replace("posenc", "hf"), n)
        for n in ("posenc_llama3", "posenc_mrope")
        if n in times
    }
    speedup_c = {
        n: paired(times, "hf_compiled", n)
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
        # hf_llama3 / posenc_llama3 and hf_mrope / posenc_mrope, paired by round: > 1 = posenc faster
        "speedup_over_hf_same_scaling": {n: v[0] for n, v in speedup_scaled.items()},
        "speedup_over_hf_same_scaling_quartiles": {
            n: v[1] for n, v in speedup_scaled.items()
        },
        # hf_compiled time / variant time, paired by round (compiled variants only)
        "speedup_over_hf_compiled": {n: v[0] for n, v in speedup_c.items()},
        "speedup_over_hf_compiled_quartiles": {n: v[1] for n, v in speedup_c.items()},
        "bytes_moved": moved["roofline_copy"],
        "gb_per_s": {
            n: round(moved[n] / statistics.median(times[n]) / 1e9, 2) for n in names
        },
    }


#: the dtypes of the plain-core comparison: posenc rotates half-precision inputs in float32 and rounds once
CORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``rotate_half``: ``[-x2, x1]`` for the halves ``x1``, ``x2`` of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def make_core_variants(
    shape: tuple[int, int, int, int],
    offset: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Callable[[], Any]]:
    """The plain core against posenc at one shape and dtype: ``minimal`` (``x * cos + rotate_half(x) * sin`` on
    tables precomputed in the inputs' dtype, the least a rotation can do in eager mode), ``hf`` (transformers'
    ``apply_rotary_pos_emb`` on the same tables, as its rotary module hands them over: in the inputs' dtype) and
    ``posenc`` (``RotaryEmbedding(head_dim, layout="half")(q, k, offset=...)``, the cached table sliced),
    ``posenc_forward`` (its ``forward`` called directly, without ``nn.Module.__call__``); in half precision also
    ``posenc_each``, the module with ``rounding="each"``."""
    apply_rotary_pos_emb = _hf_apply()
    torch.manual_seed(0)
    q = torch.randn(shape, device=device).to(dtype)
    k = torch.randn(shape, device=device).to(dtype)
    head_dim, seq_len = shape[-1], shape[-2]
    position_ids = torch.arange(offset, offset + seq_len, device=device)[None]
    cos, sin = hf_rotary_embedding(head_dim).to(device)(q, position_ids)  # q's dtype
    rope = RotaryEmbedding(head_dim, layout="half", max_len=4096).to(device)
    rope(q, k, offset=offset)  # fill the cache
    c, s = cos[:, None], sin[:, None]  # [batch, 1, seq_len, head_dim]

    def minimal() -> Any:
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    variants = {
        "minimal": minimal,
        "hf": lambda: apply_rotary_pos_emb(q, k, cos, sin),
        "posenc": lambda: rope(q, k, offset=offset),
        # the same without nn.Module.__call__ (its hooks machinery): posenc's own code
        "posenc_forward": lambda: rope.forward(q, k, offset=offset),
    }
    if dtype in (
        torch.bfloat16,
        torch.float16,
    ):  # rounding="each": transformers' arithmetic
        each = RotaryEmbedding(head_dim, layout="half", max_len=4096, rounding="each")
        each = each.to(device)
        each(q, k, offset=offset)
        variants["posenc_each"] = lambda: each(q, k, offset=offset)
    return variants


def time_core(
    device: torch.device, *, seconds: float, block_s: float, min_rounds: int = 15
) -> list[dict[str, Any]]:
    """Paired rounds of ``make_core_variants`` at every shape and dtype: ``minimal / posenc`` and ``hf / posenc``
    (time ratios, > 1: posenc faster), medians with quartiles."""
    out = []
    for dtype in CORE_DTYPES:
        for shape, (offset, _) in SHAPES.items():
            variants = make_core_variants(shape, offset, device, dtype)
            times, calls, _, rounds = time_rounds(
                variants,
                device,
                seconds=seconds,
                block_s=block_s,
                min_rounds=min_rounds,
            )
            ratio = {n: paired(times, n, "posenc") for n in ("minimal", "hf")}
            # posenc's own code, without nn.Module.__call__
            ratio["minimal_over_forward"] = paired(times, "minimal", "posenc_forward")
            # transformers' arithmetic: rounding="each" against transformers' time
            if "posenc_each" in times:
                ratio["hf_over_each"] = paired(times, "hf", "posenc_each")
            out.append({
                "device": device.type, "shape": list(shape), "first_position": offset,
                "dtype": str(dtype).removeprefix("torch."), "rounds": rounds, "calls_per_block": calls,
                "median_us": {n: round(statistics.median(v) * 1e6, 2) for n, v in times.items()},
                # variant time / posenc time, paired by round: > 1 = posenc faster
                "over_posenc": {n: v[0] for n, v in ratio.items()},
                "over_posenc_quartiles": {n: v[1] for n, v in ratio.items()},
            })  # fmt: skip
            print(
                f"{device.type} {out[-1]['dtype']:8s} {tuple(shape)!s:20s} time / posenc's: "
                + ", ".join(f"{n} {v[0]:.3f}" for n, v in ratio.items()),
                file=sys.stderr,
                flush=True,
            )
    return out


def core_goals(core: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain core's goals: a float32 decoding step within 10 % of the minimal rotation and at least as fast
    as transformers' (within 3 % of noise); in half precision, with ``rounding="each"`` (transformers' own
    arithmetic), at least 0.9 times transformers' speed. The default ``"once"`` (float32, rounded once) is
    reported beside it, without a goal: a stated choice of accuracy over speed (chapter 12)."""
    checks = []
    for res in core:
        decode, ratio = res["shape"][2] == 1, res["over_posenc"]
        wanted = []
        if res["dtype"] == "float32" and decode:
            wanted += [("minimal", "within 10 % of the minimal rotation", 1 / 1.1)]
            wanted += [("hf", "at least as fast as transformers'", 0.97)]
        elif res["dtype"] != "float32":  # rounding="each": transformers' arithmetic
            wanted += [
                (
                    "hf_over_each",
                    "with rounding='each' at least 0.9 times transformers' speed",
                    0.9,
                )
            ]
        for name, goal, floor in wanted:
            checks.append({
                "device": res["device"], "shape": res["shape"], "dtype": res["dtype"],
                "goal": f"posenc ({res['dtype']}) {goal}", "value": ratio[name], "met": ratio[name] >= floor,
            })  # fmt: skip
    return checks


#: The Llama of the swap benchmark: small, so that the rotary module's share of a forward is visible
SWAP_CONFIG: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 4096,
}  # fmt: skip
#: prompt length of the prefill, and the cache length of the decoding step
SWAP_TOKENS = 256


def make_swap_variants(
    device: torch.device, tokens: int = SWAP_TOKENS
) -> dict[str, Callable[[], Any]]:
    """A Llama forward with transformers' rotary module and with posenc's swapped in, prefill and one decoding
    step with the KV cache; and the two rotary modules alone."""
    import copy

    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from posenc import HFRotaryEmbedding

    torch.manual_seed(0)
    hf_model = LlamaForCausalLM(LlamaConfig(**SWAP_CONFIG)).to(device).eval()
    ours = copy.deepcopy(hf_model)
    ours.model.rotary_emb = HFRotaryEmbedding(ours.config).to(device)  # the swap
    ids = torch.randint(0, SWAP_CONFIG["vocab_size"], (1, tokens), device=device)
    step = ids[:, :1]
    caches = {}
    for name, model in (("hf", hf_model), ("posenc", ours)):
        caches[name] = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, past_key_values=caches[name], use_cache=True)
    hidden = torch.zeros(1, tokens, SWAP_CONFIG["hidden_size"], device=device)
    prefill_ids = torch.arange(tokens, device=device)[None]
    decode_ids = torch.tensor([[tokens]], device=device)

    def decode(name: str, model: Any) -> Callable[[], Any]:
        def call() -> Any:
            out = model(step, past_key_values=caches[name], use_cache=True)
            caches[name].crop(-1)  # back to the prompt: the same call every time
            return out

        return call

    return {
        "hf_prefill": lambda: hf_model(ids),
        "posenc_prefill": lambda: ours(ids),
        "hf_decode": decode("hf", hf_model),
        "posenc_decode": decode("posenc", ours),
        "hf_module_prefill": lambda: hf_model.model.rotary_emb(hidden, prefill_ids),
        "posenc_module_prefill": lambda: ours.model.rotary_emb(hidden, prefill_ids),
        "hf_module_decode": lambda: hf_model.model.rotary_emb(hidden, decode_ids),
        "posenc_module_decode": lambda: ours.model.rotary_emb(hidden, decode_ids),
    }


def time_swap(
    device: torch.device,
    *,
    seconds: float,
    block_s: float,
    min_rounds: int = 15,
    max_rounds: int = 400,
    tokens: int = SWAP_TOKENS,
) -> dict[str, Any]:
    """Paired rounds of the swap variants: ``speedup`` = hf time / posenc time per round, median and quartiles."""
    variants = make_swap_variants(device, tokens)
    times, calls, warmup_s, rounds = time_rounds(
        variants, device, seconds=seconds, block_s=block_s,
        min_rounds=min_rounds, max_rounds=max_rounds,
    )  # fmt: skip
    cases = ("prefill", "decode", "module_prefill", "module_decode")
    speedup = {c: paired(times, f"hf_{c}", f"posenc_{c}") for c in cases}
    return {
        "device": device.type,
        "model": {**SWAP_CONFIG, "tokens": tokens, "dtype": "float32", "eager": True},
        "rounds": rounds,
        "calls_per_block": calls,
        "warmup_s": warmup_s,
        "median_us": {
            n: round(statistics.median(t) * 1e6, 2) for n, t in times.items()
        },
        # hf time / posenc time, paired by round: >= 1 means the swapped model is at least as fast
        "speedup": {c: v[0] for c, v in speedup.items()},
        "speedup_quartiles": {c: v[1] for c, v in speedup.items()},
    }


def load_revision(rev: str, directory: Path) -> Any:
    """posenc as it was at git revision ``rev`` (``git show``), importable from ``directory`` under another
    name, with its custom operators in their own namespace so that both versions load in one process."""
    name = "posenc_" + re.sub(r"\W", "_", rev)
    package = directory / name
    package.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "posenc/"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for path in listing:
        if not path.endswith(".py"):
            continue
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        text = re.sub(r"\bposenc\.", f"{name}.", text).replace(
            '"posenc::', f'"{name}::'
        )
        target = package / Path(path).relative_to("posenc")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    return importlib.import_module(name)


def _pair_variants(
    modules: dict[str, Any],
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]],
    funcs: dict[str, Callable[..., Any]],
    q: torch.Tensor,
    k: torch.Tensor,
    offset: int,
) -> dict[str, Callable[[], Any]]:
    """``module_before``, ``module_after``, ``apply_before``, ``apply_after``: the same calls of both versions."""
    variants: dict[str, Callable[[], Any]] = {}
    for version in ("before", "after"):
        module, (c, s), f = modules[version], tables[version], funcs[version]
        variants[f"module_{version}"] = lambda m=module: m(q, k, offset=offset)
        variants[f"apply_{version}"] = lambda f=f, c=c, s=s: (
            f(q, cos=c, sin=s, layout="half"),
            f(k, cos=c, sin=s, layout="half"),
        )
    return variants


def time_before_after(
    rev: str,
    device: torch.device,
    *,
    seconds: float,
    block_s: float,
    shapes: dict[tuple[int, int, int, int], tuple[int, str]] | None = None,
    min_rounds: int = 15,
) -> dict[str, Any]:
    """The module and the function of revision ``rev`` and of the working tree, timed in the same rounds at
    every shape: ``time_before / time_after`` per round (> 1: the working tree is faster)."""
    out: dict[str, Any] = {"revision": rev, "results": []}
    with tempfile.TemporaryDirectory(prefix="posenc-before-") as tmp:
        before = load_revision(rev, Path(tmp))
        out["revision_commit"] = subprocess.run(
            ["git", "rev-parse", rev],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for shape, (offset, _) in (shapes or SHAPES).items():
            torch.manual_seed(0)
            q, k = torch.randn(shape, device=device), torch.randn(shape, device=device)
            head_dim, seq_len = shape[-1], shape[-2]
            p = torch.arange(offset, offset + seq_len, device=device)
            modules = {
                "before": before.RotaryEmbedding(head_dim, layout="half").to(device),
                "after": RotaryEmbedding(head_dim, layout="half").to(device),
            }
            tables = {
                "before": before.rotary_cos_sin(p, head_dim, layout="half"),
                "after": rotary_cos_sin(p, head_dim, layout="half"),
            }
            funcs = {"before": before.apply_rotary, "after": apply_rotary}
            results = {v: modules[v](q, k, offset=offset) for v in modules}
            same = all(
                torch.equal(a, b) for a, b in zip(results["before"], results["after"])
            )
            variants = _pair_variants(modules, tables, funcs, q, k, offset)
            times, _, _, rounds = time_rounds(
                variants,
                device,
                seconds=seconds,
                block_s=block_s,
                min_rounds=min_rounds,
            )
            ratios = {
                n: paired(times, f"{n}_before", f"{n}_after")
                for n in ("module", "apply")
            }
            out["results"].append({
                "shape": list(shape), "first_position": offset, "rounds": rounds,
                "bitwise_equal": same,
                "median_us": {n: round(statistics.median(t) * 1e6, 2) for n, t in times.items()},
                # time before / time after, paired by round: > 1 = the working tree is faster
                "before_over_after": {n: v[0] for n, v in ratios.items()},
                "before_over_after_quartiles": {n: v[1] for n, v in ratios.items()},
            })  # fmt: skip
            print(
                f"{device.type} {tuple(shape)!s:20s} before/after: "
                + ", ".join(f"{n} {v[0]:.3f}" for n, v in ratios.items()),
                file=sys.stderr,
                flush=True,
            )
    return out


def swap_goals(swap: dict[str, Any], noise: float = 0.03) -> list[dict[str, Any]]:
    """The swap's goal: a Llama forward with posenc.HFRotaryEmbedding at least as fast as with transformers' own
    module, prefill and decoding step, within ``noise``."""
    return [
        {"device": swap["device"], "shape": [1, swap["model"]["tokens"] if case == "prefill" else 1],
         "goal": f"Llama {case} with HFRotaryEmbedding at least as fast as with LlamaRotaryEmbedding",
         "value": swap["speedup"][case], "met": swap["speedup"][case] >= 1 - noise}
        for case in ("prefill", "decode")
    ]  # fmt: skip


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
        scaled = res.get("speedup_over_hf_same_scaling", {})
        pairs += [  # the same scaling on both sides, eager
            (n, n.replace("posenc", "hf") + " eager", scaled[n])
            for n in ("posenc_llama3", "posenc_mrope")
            if n in scaled
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
    device: str,
    *,
    seconds: float,
    block_s: float,
    compiled: bool,
    before: str | None = None,
    swap_only: bool = False,
    core_only: bool = False,
) -> dict[str, Any]:
    dev = torch.device(device)
    start = time.perf_counter()
    load_before = _load_average()
    results = []
    swap = None if core_only else time_swap(dev, seconds=2 * seconds, block_s=block_s)
    if swap is not None:
        print(
            f"{device} Llama swap, hf / posenc: "
            + ", ".join(f"{c} {v:.3f}" for c, v in swap["speedup"].items()),
            file=sys.stderr,
            flush=True,
        )
    core = [] if swap_only else time_core(dev, seconds=seconds, block_s=block_s)
    for shape, (offset, limit) in {} if swap_only or core_only else SHAPES.items():
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
    before_after = (
        time_before_after(before, dev, seconds=seconds, block_s=block_s)
        if before
        else None
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
        "swap": swap,
        "results": results,
        "core": core,
        "goals": (swap_goals(swap) if swap else []) + goals(results) + core_goals(core),
        **({"before_after": before_after} if before_after else {}),
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
        "--before",
        default=None,
        metavar="REV",
        help="also time posenc at this git revision beside the working tree, paired by round",
    )
    parser.add_argument(
        "--load-note",
        default=None,
        help="a note on the machine's load during the run, stored in the results file",
    )
    parser.add_argument(
        "--swap-only",
        action="store_true",
        help="time only the Llama swap (posenc.HFRotaryEmbedding against transformers' module)",
    )
    parser.add_argument(
        "--core-only",
        action="store_true",
        help="time only the plain core: minimal rotation, transformers' and posenc's, in float32, bf16, fp16",
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
        compiled=args.compiled and not args.swap_only,
        before=args.before,
        swap_only=args.swap_only,
        core_only=args.core_only,
    )
    if args.load_note:
        report["load_note"] = args.load_note
    text = json.dumps(report, indent=1)
    if args.out == "-":
        print(text)
        return 0
    prefix = "gpu" if args.device == "cuda" else "cpu"
    prefix = f"swap-{prefix}" if args.swap_only else prefix
    prefix = f"core-{prefix}" if args.core_only else prefix
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
