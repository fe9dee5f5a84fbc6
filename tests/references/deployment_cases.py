"""The deployment matrix: posenc's public modules as people deploy them, and the paths they take.

Each :class:`Case` is one public name wrapped as an ``nn.Module`` whose ``forward`` takes tensors only (what
torch.export, ONNX, AOTInductor and jit.trace need), with the calls a deployed program is checked on: two calls of
the same shapes and different values (a program that baked an input in as a constant fails the second), or, for a
stateful module (dynamic NTK), calls of several lengths. :data:`PATHS` names every path;
tests/deployment/test_deployment.py runs each case through each path, and :data:`KNOWN_FAILURES` lists the pairs
that fail today, with the error seen, so that a book chapter can print the support table from this module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import posenc

HEAD_DIM = 16
#: transformers' config sizes: head_dim 16, dynamic NTK past 16 positions
HF_SIZES = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16,
}
#: rope_parameters of each rope_type, as a transformers config holds them
ROPE_PARAMETERS: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": 1e4},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 1e4,
        "original_max_position_embeddings": 8,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "factor": 2.0,
        "short_factor": [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)],
        "long_factor": [1.0 + 0.8 * i for i in range(HEAD_DIM // 2)],
        "original_max_position_embeddings": 8,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
        "rope_theta": 5e5,
    },
}


@dataclass(frozen=True)
class Case:
    """One public name, wrapped for deployment.

    ``build()`` makes a fresh module; ``calls()`` the inputs of each call, in order (the deployed program and a
    fresh eager module get the same calls, and must give the same results). ``dynamic``: the sequence axis of each
    input, for a case whose calls differ in length (exported with that axis dynamic, ``Dim("seq")``).
    """

    name: str
    build: Callable[[], nn.Module]
    calls: Callable[[], list[tuple[Tensor, ...]]]
    dynamic: tuple[int | None, ...] | None = None
    notes: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)


class _Fn(nn.Module):
    """A function of tensors as a module (export, ONNX and tracing take modules)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Tensor) -> Any:
        return self.fn(*args)


class _RotateAt(nn.Module):
    """``RotaryEmbedding.rotate(x, positions=...)``: the positions are an input."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = posenc.RotaryEmbedding(HEAD_DIM, max_len=32)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.rope.rotate(x, positions=positions)


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=_seeded(seed))


def _positions(seed: int, n: int = 6, high: int = 30) -> Tensor:
    return torch.randint(0, high, (n,), generator=_seeded(seed))


def padding_mask(batch: int, height: int, width: int, seed: int) -> Tensor:
    """DETR's mask ``[batch, height, width]``: True on the padding, each image at the top left of its own."""
    g = _seeded(seed)
    mask = torch.ones(batch, height, width, dtype=torch.bool)
    for b in range(batch):
        h, w = (int(torch.randint(1, n + 1, (), generator=g)) for n in (height, width))
        mask[b, :h, :w] = False
    return mask


def hf_config(rope_type: str) -> Any:
    import transformers

    return transformers.LlamaConfig(
        **HF_SIZES, rope_parameters=dict(ROPE_PARAMETERS[rope_type])
    )


def _hf_calls(rope_type: str) -> Callable[[], list[tuple[Tensor, ...]]]:
    def calls() -> list[tuple[Tensor, ...]]:
        x = torch.zeros(1, 1, HF_SIZES["hidden_size"])
        if rope_type == "dynamic":  # past max_position_embeddings, then shorter
            return [(x, torch.arange(n)[None]) for n in (40, 20)]
        # longrope: the short factors, then the long ones (past the original 8)
        return [(x, torch.arange(6)[None]), (x, torch.arange(6)[None] + 7)]

    return calls


def _hf_case(rope_type: str) -> Case:
    return Case(
        f"HFRotaryEmbedding[{rope_type}]",
        lambda: posenc.HFRotaryEmbedding(hf_config(rope_type)),
        _hf_calls(rope_type),
        dynamic=(None, 1) if rope_type == "dynamic" else None,
        tags=frozenset({"hf", "stateful"} if rope_type == "dynamic" else {"hf"}),
    )


CASES: tuple[Case, ...] = (
    Case(
        "PositionalEncoding",
        lambda: posenc.PositionalEncoding(HEAD_DIM, max_len=32).eval(),
        lambda: [(_randn(6, 2, HEAD_DIM, seed=s),) for s in (0, 1)],
    ),
    Case(
        "RotaryEmbedding",
        lambda: posenc.RotaryEmbedding(HEAD_DIM, max_len=32),
        lambda: [
            (_randn(1, 2, 6, HEAD_DIM, seed=s), _randn(1, 2, 6, HEAD_DIM, seed=s + 9))
            for s in (0, 1)
        ],
    ),
    Case(
        "RotaryEmbedding.rotate(positions=)",
        _RotateAt,
        lambda: [(_randn(1, 2, 6, HEAD_DIM, seed=s), _positions(s)) for s in (0, 1)],
    ),
    Case(
        "apply_rotary",
        lambda: _Fn(posenc.apply_rotary),
        lambda: [(_randn(1, 2, 6, HEAD_DIM, seed=s), _positions(s)) for s in (0, 1)],
    ),
    Case(
        "rotary_cos_sin",
        lambda: _Fn(lambda p: posenc.rotary_cos_sin(p, HEAD_DIM)),
        lambda: [(_positions(s),) for s in (0, 1)],
    ),
    *(_hf_case(rope_type) for rope_type in ROPE_PARAMETERS),
    Case(
        "Timesteps",
        lambda: posenc.Timesteps(HEAD_DIM),
        lambda: [(torch.rand(3, generator=_seeded(s)) * 1000,) for s in (0, 1)],
    ),
    Case(
        "sincos_grid",
        lambda: _Fn(
            lambda x: x + posenc.sincos_grid((2, 3), HEAD_DIM, device=x.device)
        ),
        lambda: [(_randn(6, HEAD_DIM, seed=s),) for s in (0, 1)],
    ),
    Case(
        "detr_sine_encoding",
        lambda: _Fn(lambda mask: posenc.detr_sine_encoding(mask, 8, normalize=True)),
        lambda: [(padding_mask(2, 3, 4, seed=s),) for s in (0, 1)],
    ),
)
CASE = {case.name: case for case in CASES}

#: every path a case is deployed through (tests/deployment/test_deployment.py runs them)
PATHS: dict[str, str] = {
    "export": "torch.export.export(strict=False), run as ep.module()",
    "export_strict": "torch.export.export(strict=True), run as ep.module()",
    "export_saved": "torch.export.save then torch.export.load, run as ep.module()",
    "onnx": "torch.onnx.export(dynamo=True), run in onnxruntime",
    "onnx_legacy": "torch.onnx.export(dynamo=False), run in onnxruntime",
    "onnx_legacy_inside": "torch.onnx.export(dynamo=False) of a model whose forward calls the module",
    "aoti": "torch._inductor.aoti_compile_and_package, run as the loaded package",
    "jit_trace": "torch.jit.trace, first use inside the trace",
    "fake": "one call under FakeTensorMode, then real calls",
    "meta_built": "built under torch.device('meta'), to_empty(device='cpu'), then real calls",
    "meta_call": "one call with meta inputs, then real calls",
    "to_meta": "module.to('meta'), to_empty(device='cpu'), then real calls",
    "meta_context": "first call inside torch.device('meta'), then real calls",
}

#: (path, case) -> the error or wrong result seen with torch 2.13.0, onnx 1.23.2, onnxscript 0.7.2,
#: onnxruntime 1.32.0 (tests/deployment/test_deployment.py marks each xfail(strict=True): a fix
#: makes it fail until removed)
KNOWN_FAILURES: dict[tuple[str, str], str] = {}

# --- the support table ----------------------------------------------------------------------------------------------

#: what each (path, case) gave, recorded by `python tools/deployment_table.py --record` from
#: tests/deployment/test_deployment.py (every test that runs a case through a path checks that its
#: result is still the one recorded here)
OUTCOMES = (
    Path(__file__).resolve().parents[2]
    / "benchmarks"
    / "results"
    / "deployment-cpu.json"
)
#: the paths as the table's columns, in order, with their short headings
COLUMNS: dict[str, str] = {
    "export": "export",
    "export_strict": "export strict",
    "export_saved": "export saved",
    "onnx": "ONNX",
    "onnx_legacy": "legacy ONNX",
    "onnx_legacy_inside": "legacy ONNX inside",
    "aoti": "AOTI",
    "jit_trace": "jit.trace",
    "fake": "fake",
    "meta_built": "meta built",
    "meta_call": "meta call",
    "to_meta": "to meta",
    "meta_context": "meta context",
    "vmap": "vmap",
}


@functools.cache
def committed_outcomes() -> dict[tuple[str, str], dict[str, str]]:
    """The committed table: ``(path, case) -> {"outcome": works | refused | fails, "message": ...}``."""
    data = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    return {
        (path, case): entry
        for path, cases in data["outcomes"].items()
        for case, entry in cases.items()
    }


def support_table(outcomes: dict[tuple[str, str], dict[str, str]]) -> str:
    """The table of paths (columns) x public names (rows, in the order of CASES) as Markdown, each refusal
    footnoted with posenc's message and each failure with its known cause (KNOWN_FAILURES)."""
    named = [case.name for case in CASES]
    rows = named + sorted({case for _, case in outcomes} - set(named))
    notes: list[str] = []

    def cell(path: str, case: str) -> str:
        entry = outcomes.get((path, case))
        if entry is None:
            return "–"
        if entry["outcome"] == "works":
            return "✓"
        text = KNOWN_FAILURES.get((path, case), entry["message"])
        if text not in notes:
            notes.append(text)
        return f"{entry['outcome']} ({notes.index(text) + 1})"

    lines = [
        "| | " + " | ".join(COLUMNS.values()) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for case in rows:
        cells = " | ".join(cell(path, case) for path in COLUMNS)
        lines.append(f"| `{case}` | {cells} |")
    lines.append("")
    lines += [f"({i}) {text}" for i, text in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


#: what the vmap column runs (tests/deployment/test_deployment.py, ``VMAP``)
VMAP_PATH = "torch.func.vmap over a batch, each sample with its own positions where the name takes them"


def support_summary(outcomes: dict[tuple[str, str], dict[str, str]]) -> str:
    """The same outcomes as :func:`support_table`, one row per public name with the paths grouped by what they
    gave (a table narrow enough for a page: the grid has fifteen columns), the same footnotes, then what each path
    runs. Markdown: the table, a blank line, the footnotes, a blank line, the paths' table."""
    grid = support_table(outcomes)
    notes = grid.split("\n\n", 1)[1]
    numbered = [line.split(") ", 1)[1] for line in notes.splitlines() if line]
    named = [case.name for case in CASES]
    lines = ["| | gives eager's result | refused or fails |", "|---|---|---|"]
    for case in named + sorted({case for _, case in outcomes} - set(named)):
        works, other = [], {}
        for path, heading in COLUMNS.items():
            entry = outcomes.get((path, case))
            if entry is None:
                continue
            if entry["outcome"] == "works":
                works.append(heading)
                continue
            text = KNOWN_FAILURES.get((path, case), entry["message"])
            other.setdefault(
                f"{entry['outcome']} ({numbered.index(text) + 1})", []
            ).append(heading)
        missing = [h for p, h in COLUMNS.items() if (p, case) not in outcomes]
        if other:
            gives = ", ".join(works) or "–"
        elif len(works) == 1:
            gives = f"{works[0]}, the one path run"
        else:
            gives = f"all {len(works)} paths" + (
                f" (not run: {', '.join(missing)})" if missing else ""
            )
        refused = "; ".join(f"{k}: {', '.join(v)}" for k, v in other.items()) or "–"
        lines.append(f"| `{case}` | {gives} | {refused} |")
    paths = [
        "| path | what the test does, then compares with eager mode |",
        "|---|---|",
    ]
    paths += [f"| {COLUMNS[p]} | {PATHS.get(p, VMAP_PATH)} |" for p in COLUMNS]
    return (
        "\n".join(lines)
        + "\n\n"
        + notes.rstrip("\n")
        + "\n\n"
        + "\n".join(paths)
        + "\n"
    )
