"""The first-read chapter (book/00_first_read.ipynb): its claims, checked again on the package, and its limits as a
twenty-minute read (prose, figures, visible code, an animation that plays offline and is the same on every run)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import posenc

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "book" / "00_first_read.ipynb"


def _attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The chapter's head: one head without positions, tokens [seq_len, d] -> [seq_len, d]."""
    q, k, v = x @ w[0], x @ w[1], x @ w[2]
    d = x.shape[-1]
    return torch.softmax(q @ k.T / d**0.5, dim=-1) @ v


def test_a_shuffled_sentence_only_shuffles_the_outputs_until_positions_are_added() -> (
    None
):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 8, dtype=torch.float64, generator=gen)
    w = torch.randn(3, 8, 8, dtype=torch.float64, generator=gen) / 8**0.5
    order = torch.randperm(7, generator=gen)
    assert torch.allclose(_attention(x[order], w), _attention(x, w)[order], atol=1e-12)
    pe = posenc.sinusoidal_encoding(7, 8, dtype=torch.float64)
    moved = (_attention(x[order] + pe, w) - _attention(x + pe, w)[order]).abs()
    # every word that moved gets another output once the positions are added
    assert (moved.amax(dim=1)[order != torch.arange(7)] > 1e-3).all()


def _diagonal_spread(scores: torch.Tensor) -> float:
    n = scores.shape[0]
    return max(
        (d.max() - d.min()).item()
        for d in (scores.diagonal(o) for o in range(-n + 1, n))
    )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotated_scores_depend_on_the_offset_only_added_ones_do_not(
    layout: str,
) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 64, dtype=torch.float64, generator=gen)
    queries, keys = q.expand(32, 64), k.expand(32, 64)
    turned_q, turned_k = posenc.RotaryEmbedding(64, layout=layout)(queries, keys)
    assert _diagonal_spread(turned_q @ turned_k.T) < 1e-9
    pe = posenc.sinusoidal_encoding(32, 64, dtype=torch.float64)
    assert _diagonal_spread((queries + pe) @ (keys + pe).T) > 1.0


def test_one_pair_in_complex_numbers_scores_by_the_offset() -> None:
    # eq-fr-rope: Re[(q e^{i m w}) conj(k e^{i n w})] = Re[q conj(k) e^{i (m - n) w}]
    q, k, omega = complex(0.95, 0.20), complex(0.35, 0.75), 0.3

    def score(m: int, n: int) -> float:
        turned_q = q * complex(math.cos(m * omega), math.sin(m * omega))
        turned_k = k * complex(math.cos(n * omega), math.sin(n * omega))
        return (turned_q * turned_k.conjugate()).real

    scores = [score(m, m + 3) for m in (1, 8, 1000)]
    assert max(scores) - min(scores) < 1e-9
    # and it is the dot product of the turned pairs, as the chapter's figure draws them
    a = 8 * omega
    turned = (
        q.real * math.cos(a) - q.imag * math.sin(a),
        q.real * math.sin(a) + q.imag * math.cos(a),
    )
    b = 11 * omega
    turned_k = (
        k.real * math.cos(b) - k.imag * math.sin(b),
        k.real * math.sin(b) + k.imag * math.cos(b),
    )
    assert abs(turned[0] * turned_k[0] + turned[1] * turned_k[1] - scores[1]) < 1e-12


def test_grid_scores_depend_on_the_displacement_only() -> None:
    grid = posenc.sincos_grid((8, 8), 64, dtype=torch.float64)
    similarity = grid @ grid.T
    by_displacement: dict[tuple[int, int], list[float]] = {}
    for a in range(64):
        for b in range(64):
            shift = (b // 8 - a // 8, b % 8 - a % 8)
            by_displacement.setdefault(shift, []).append(similarity[a, b].item())
    assert max(max(v) - min(v) for v in by_displacement.values()) < 1e-9
    # largest at the patch itself
    assert torch.equal(similarity.argmax(dim=1), torch.arange(64))


def test_the_numbers_in_the_prose() -> None:
    # "hand 1 of a 16-channel encoding ... turns 10^(-1/2) ≈ 0.32 radians per position"
    assert round(posenc.frequencies(16)[1].item(), 2) == 0.32
    assert math.isclose(posenc.frequencies(16)[1].item(), 10**-0.5)
    # "four hands, each ten times slower than the one before" (d = 8)
    assert torch.allclose(
        posenc.frequencies(8), torch.tensor([1, 0.1, 0.01, 0.001], dtype=torch.float64)
    )
    # "at p = 100 the fastest hand has gone round nearly sixteen times"
    assert 15.5 < 100 / (2 * math.pi) < 16
    # "a whole radian (57°)"
    assert round(math.degrees(1)) == 57


# ---- the chapter as a twenty-minute read --------------------------------------------------------------------------


def _cells() -> list[dict]:
    return json.loads(CHAPTER.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def prose_words() -> int:
    """Words a reader reads: the markdown cells without display math, and the figure captions."""
    text = [_source(c) for c in _cells() if c["cell_type"] == "markdown"]
    text += [
        c["metadata"]["mystnb"]["figure"]["caption"]
        for c in _cells()
        if "mystnb" in c.get("metadata", {})
    ]
    words = 0
    for chunk in text:
        chunk = re.sub(r"\$\$.*?\$\$( \(eq-[\w-]+\))?", " ", chunk, flags=re.DOTALL)
        words += len(
            re.findall(r"[^\s]+", re.sub(r"[#*:`{}]|\(eq-[\w-]+\)", " ", chunk))
        )
    return words


def figures() -> list[dict]:
    """Code cells with a captioned figure that shows an image or an animation."""
    return [
        c
        for c in _cells()
        if c["cell_type"] == "code"
        and "mystnb" in c.get("metadata", {})
        and any(
            {"image/png", "text/html"} & set(o.get("data", {})) for o in c["outputs"]
        )
    ]


def visible_code_lines() -> list[int]:
    """Line counts of the code cells a reader sees unfolded."""
    return [
        len(_source(c).strip().splitlines())
        for c in _cells()
        if c["cell_type"] == "code"
        and not {"hide-input", "hide-cell", "remove-input", "remove-cell"}
        & set(c.get("metadata", {}).get("tags", []))
    ]


def test_the_chapter_reads_in_twenty_minutes() -> None:
    assert 1500 < prose_words() <= 4000, prose_words()
    assert len(figures()) >= 5
    assert visible_code_lines() and max(visible_code_lines()) <= 15, (
        visible_code_lines()
    )
    for cell in _cells():
        if cell["cell_type"] == "code":
            long = [line for line in _source(cell).splitlines() if len(line) > 88]
            assert not long, long


def test_no_floating_point_error_talk() -> None:
    text = " ".join(
        _source(c) for c in _cells() if c["cell_type"] == "markdown"
    ).lower()
    for phrase in (
        "float32",
        "float64",
        "rounding",
        "2^-24",
        "2^{-24}",
        "machine epsilon",
        "ulp",
    ):
        assert phrase not in text, phrase


def _animation_html() -> str:
    (cell,) = [
        c
        for c in figures()
        if any("text/html" in o.get("data", {}) for o in c["outputs"])
    ]
    (html,) = [
        "".join(o["data"]["text/html"])
        for o in cell["outputs"]
        if "text/html" in o.get("data", {})
    ]
    return html


def test_the_animation_plays_offline_and_is_the_same_on_every_run() -> None:
    html = _animation_html()
    assert (
        "new Animation(frames" in html
    )  # matplotlib's player, with its frames embedded
    assert len(re.findall(r'frames\[\d+\] = "data:image/png;base64,', html)) == 24
    # nothing fetched from the internet (the page's own icon font draws the buttons)
    assert not re.search(r"https?://", html), re.findall(r"https?://\S+", html)[:3]
    # no random element id: matplotlib's 32-digit uuid is replaced by a fixed one
    assert not re.search(r"[0-9a-f]{32}", html)
    assert "_anim_imgfirstreadpair" in html
    assert len(html) < 300_000, len(html)
