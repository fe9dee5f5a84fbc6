"""Rotary embeddings used the wrong way, or in the wrong place (book/06_rotary.ipynb, book/15_rotary_conventions.ipynb).

Each test is a misuse or a setting that once gave a silent or late failure: a module first used under
``torch.inference_mode()``, an edited ``frequencies`` tensor, the peak memory of a large table, settings changed
after the first call, dynamic NTK on the meta device and from several threads, host synchronisations on an
accelerator (found without a GPU by tests/references/host_syncs.py), and the Hugging Face conventions a module must
follow (tables in the input's dtype, M-RoPE positions ``[batch, seq_len]``, longrope and dynamic under torch.compile).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from posenc import RotaryEmbedding, apply_rotary, rotary_cos_sin, rotary_frequencies
from tests.references.floors import needs_compile, needs_fake_accelerator
from tests.references.host_syncs import DEVICE, host_syncs

DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
LONGROPE = {
    "rope_type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(8)],
    "long_factor": [1.0 + 0.5 * i for i in range(8)], "factor": 8.0,
    "original_max_position_embeddings": 32,
}  # fmt: skip
MROPE = {"mrope_section": [2, 3, 3]}


def test_a_module_first_used_in_inference_mode_still_trains() -> None:
    # the cached tables are built outside inference mode: a validation pass, a sanity check or a generation
    # warm-up at step 0 must not leave inference tensors that autograd cannot save
    rope = RotaryEmbedding(16, max_len=32)
    with torch.inference_mode():
        rope(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16))
    q = torch.randn(1, 2, 5, 16, requires_grad=True)
    rq, rk = rope(q, q.detach() * 2)
    (rq * rk).sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_frequencies_are_a_copy() -> None:
    rope = RotaryEmbedding(16, max_len=8)
    x = torch.randn(1, 1, 4, 16, dtype=torch.float64)
    before = rope.rotate(x, offset=100)  # past max_len: computed from the frequencies
    omega = rope.frequencies
    omega.mul_(2)  # an in-place edit of what the property returned
    assert torch.equal(rope.frequencies, rotary_frequencies(16)[0])
    assert torch.equal(rope.rotate(x, offset=100), before)


def _peak_above_now(fn) -> int:
    """Bytes of resident memory ``fn()`` adds at its peak (Linux: VmHWM reset through /proc/self/clear_refs)."""
    status = Path("/proc/self/status")

    def read(field: str) -> int:
        line = next(x for x in status.read_text().splitlines() if x.startswith(field))
        return int(line.split()[1]) * 1024

    try:
        # the peak := the current resident size
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as error:
        pytest.skip(f"cannot reset the peak resident size here: {error}")
    now = read("VmRSS:")
    fn()
    return read("VmHWM:") - now


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_building_the_table_peaks_below_one_and_a_half_tables() -> None:
    # the float64 angles, cosines and sines are formed a block of positions at a time, not whole
    rope = RotaryEmbedding(128, max_len=2**16)
    q = torch.randn(1, 1, 1, 128)
    table_bytes = 2 * 2**16 * 128 * 4  # cos and sin, float32: 64 MiB
    peak = _peak_above_now(lambda: rope(q, q))
    assert rope._tables[(q.device, torch.float32)][0].shape == (2**16, 128)
    assert peak <= 1.5 * table_bytes, (
        f"peak {peak / 2**20:.0f} MiB for {table_bytes / 2**20:.0f} MiB of tables"
    )


@pytest.mark.parametrize(
    "name", ["max_len", "base", "layout", "rotary_dim", "head_dim", "rope_type"]
)
def test_settings_cannot_change_after_construction(name: str) -> None:
    # the cached tables follow the settings: a changed max_len or base would be ignored, silently
    rope = RotaryEmbedding(16, max_len=8)
    x = torch.randn(1, 1, 3, 16)
    rope(x, x)
    value = getattr(rope, name)
    with pytest.raises(
        AttributeError, match=rf"RotaryEmbedding\.{name} is fixed at construction"
    ):
        setattr(rope, name, value)
    assert getattr(rope, name) == value


def test_dynamic_ntk_on_the_meta_device() -> None:
    # no values to read: the module keeps its length, and the shapes come out right
    rope = RotaryEmbedding(16, scaling=DYNAMIC)
    q = torch.empty(2, 4, 100, 16, device="meta")
    positions = torch.empty(2, 100, dtype=torch.long, device="meta")
    rq, rk = rope(q, q, positions=positions)
    assert rq.shape == rk.shape == q.shape and rq.device.type == "meta"
    cos, _ = rope.cos_sin(positions)
    assert cos.shape == (2, 100, 16) and rope._seq_len is None


class _SlowState(RotaryEmbedding):
    """Dynamic NTK whose state takes 50 ms to read in the thread named "slow": another thread's whole call fits
    between that read and the write that follows it, unless the module updates its state one call at a time."""

    @property
    def _seq_len(self) -> int | None:
        value = self.__dict__.get("_state")
        if threading.current_thread().name == "slow":
            time.sleep(0.05)
        return value

    @_seq_len.setter
    def _seq_len(self, value: int | None) -> None:
        self.__dict__["_state"] = value


def test_dynamic_ntk_updates_its_state_one_call_at_a_time() -> None:
    # a call of 200 tokens reads the state, then one of 300 tokens runs whole, then the first writes: without
    # one update at a time the module forgets the 300 (a state no serial order of the two calls gives). Which
    # serial order concurrent calls take stays up to the threads' timing (the docstring says so)
    rope = _SlowState(8, scaling=DYNAMIC, max_len=16)
    x = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    slow = threading.Thread(
        target=rope.rotate, args=(x,), kwargs={"offset": 199}, name="slow"
    )
    fast = threading.Thread(target=rope.rotate, args=(x,), kwargs={"offset": 299})
    slow.start()
    time.sleep(0.01)
    fast.start()
    slow.join()
    fast.join()
    assert rope._seq_len == 300
    assert torch.equal(
        rope.frequencies, rotary_frequencies(8, scaling=DYNAMIC, seq_len=300)[0]
    )


# ----------------------------------------------------------------------------------------------------------
# Host synchronisations on an accelerator (fake tensors: tests/references/host_syncs.py)
# ----------------------------------------------------------------------------------------------------------


def _fake(*shape: int, dtype: torch.dtype = torch.float32):
    if dtype.is_floating_point:
        return lambda: torch.randn(*shape, dtype=dtype, device=DEVICE)
    return lambda: torch.randint(0, 100, shape, dtype=dtype, device=DEVICE)


def _mrope() -> RotaryEmbedding:
    """M-RoPE, its per-axis frequencies set by hand: made in the fake mode, where the CPU work that computes them
    (a data-dependent ``repeat_interleave``, no synchronisation on real hardware) cannot run."""
    rope = RotaryEmbedding(16, layout="half", scaling=MROPE)
    omega, start, rows = (
        rotary_frequencies(16)[0],
        0,
        torch.zeros(3, 8, dtype=torch.float64),
    )
    for axis, pairs in enumerate(MROPE["mrope_section"]):
        rows[axis, start : start + pairs] = omega[start : start + pairs]
        start += pairs
    rope._rope._omega[None] = rows
    return rope


# each call's arguments are made in the fake mode: modules too, so that their frequencies are fake CPU tensors
SYNC_FREE = {
    "module, offset": (
        lambda m, q: m(q, q, offset=3),
        [lambda: RotaryEmbedding(16, max_len=32), _fake(1, 2, 5, 16)],
    ),
    "module, past max_len": (
        lambda m, q: m.rotate(q, offset=3),
        [lambda: RotaryEmbedding(16, max_len=4), _fake(1, 2, 5, 16)],
    ),
    "module, positions [batch, seq_len]": (
        lambda m, q, p: m(q, q, positions=p),
        [
            lambda: RotaryEmbedding(16, layout="half"),
            _fake(2, 2, 5, 16),
            _fake(2, 5, dtype=torch.long),
        ],
    ),
    "module, bfloat16": (
        lambda m, q: m(q, q, offset=9),
        [lambda: RotaryEmbedding(16), _fake(1, 2, 5, 16, dtype=torch.bfloat16)],
    ),
    "module, longrope positions": (
        lambda m, q, p: m.rotate(q, positions=p),
        [
            lambda: RotaryEmbedding(16, scaling=LONGROPE),
            _fake(1, 2, 5, 16),
            _fake(5, dtype=torch.long),
        ],
    ),
    "module, M-RoPE [batch, seq_len]": (
        lambda m, q, p: m.rotate(q, positions=p),
        [_mrope, _fake(2, 2, 5, 16), _fake(2, 5, dtype=torch.long)],
    ),
    "module.cos_sin": (
        lambda m, x, p: m.cos_sin(p, x),
        [
            lambda: RotaryEmbedding(16, layout="half"),
            _fake(2, 5, 64),
            _fake(2, 5, dtype=torch.long),
        ],
    ),
    "apply_rotary, positions": (
        lambda x, p: apply_rotary(x, p),
        [_fake(1, 2, 5, 16), _fake(5, dtype=torch.long)],
    ),
    "apply_rotary, offset": (
        lambda x: apply_rotary(x, 7, layout="half"),
        [_fake(1, 2, 5, 16)],
    ),
    "apply_rotary, tables": (
        lambda x, c, s: apply_rotary(x, cos=c, sin=s),
        [_fake(1, 2, 5, 16), _fake(5, 16), _fake(5, 16)],
    ),
    "apply_rotary, longrope": (
        lambda x, p: apply_rotary(x, p, scaling=LONGROPE),
        [_fake(1, 2, 5, 16), _fake(5, dtype=torch.long)],
    ),
    "rotary_cos_sin": (
        lambda p: rotary_cos_sin(p, 16, scaling=LONGROPE),
        [_fake(2, 5, dtype=torch.long)],
    ),
}


@needs_fake_accelerator
@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_no_host_synchronisation_on_an_accelerator(name: str) -> None:
    fn, make = SYNC_FREE[name]
    assert host_syncs(fn, *make) == []


def test_dynamic_ntk_reads_the_largest_position_as_transformers_does() -> None:
    # its state follows the host value of the largest position: one read per call with positions, none with
    # an offset (documented in RotaryEmbedding's docstring)
    def make() -> RotaryEmbedding:
        return RotaryEmbedding(16, scaling=DYNAMIC)

    reads = host_syncs(
        lambda m, q, p: m.rotate(q, positions=p),
        make,
        _fake(1, 2, 5, 16),
        _fake(5, dtype=torch.long),
    )
    assert len(reads) == 1, reads
    assert (
        host_syncs(lambda m, q: m.rotate(q, offset=100), make, _fake(1, 2, 5, 16)) == []
    )


def test_cpu_inputs_keep_their_value_checks() -> None:
    with pytest.raises(ValueError, match="positions must be >= 0"):
        RotaryEmbedding(16).rotate(
            torch.zeros(1, 2, 3, 16), positions=torch.tensor([0, -1, 2])
        )
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rotary_cos_sin(torch.tensor([3, -2]), 16)


# ----------------------------------------------------------------------------------------------------------
# Hugging Face's conventions: tables in the input's dtype, M-RoPE positions [batch, seq_len]
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str
)
def test_cos_sin_follows_the_input_dtype_as_hugging_face_modules_do(
    dtype: torch.dtype,
) -> None:
    rope = RotaryEmbedding(16, layout="half")
    # called as transformers' rotary_emb(hidden_states, position_ids)
    hidden = torch.randn(2, 5, 64, dtype=dtype)
    position_ids = torch.arange(5).expand(2, -1)
    cos, sin = rope.cos_sin(position_ids, hidden)
    want = rotary_cos_sin(position_ids, 16, layout="half", dtype=dtype)
    assert cos.dtype == sin.dtype == dtype and cos.shape == (2, 5, 16)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    # without x: float32, as before
    assert rope.cos_sin(position_ids)[0].dtype == torch.float32
    assert (
        rope.cos_sin(position_ids, hidden, dtype=torch.float32)[0].dtype
        == torch.float32
    )


def test_mrope_takes_hugging_face_position_ids() -> None:
    # [batch, seq_len]: the same position on every axis, as transformers expands text tokens' position_ids
    rope = RotaryEmbedding(16, layout="half", base=1e6, scaling=MROPE)
    q = torch.randn(2, 4, 6, 16)
    # row 1: left padding
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    expanded = position_ids.expand(3, 2, 6)
    assert torch.equal(
        rope.rotate(q, positions=position_ids), rope.rotate(q, positions=expanded)
    )
    assert torch.equal(rope.cos_sin(position_ids)[0], rope.cos_sin(expanded)[0])
    assert torch.equal(apply_rotary(q, position_ids, layout="half", base=1e6, scaling=MROPE),
                       rope.rotate(q, positions=expanded))  # fmt: skip
    # a batch of 3: [3, seq_len] is both [axes, seq_len] and [batch, seq_len]; refused, not guessed
    q3 = torch.randn(3, 4, 6, 16)
    with pytest.raises(ValueError, match=r"pass \[axes, batch, seq_len\]"):
        rope.rotate(q3, positions=position_ids[:1].expand(3, -1))
    with pytest.raises(ValueError, match=r"pass \[axes, batch, seq_len\]"):
        rope.cos_sin(position_ids[:1].expand(3, -1), q3)
    # Flux and grid embeddings (axes_dim) keep their own [axes, seq_len]
    grid = RotaryEmbedding(16, axes_dim=[8, 8])
    with pytest.raises(ValueError, match="positions must have shape"):
        grid.rotate(torch.randn(4, 4, 6, 16), positions=torch.arange(6).expand(4, -1))


# ----------------------------------------------------------------------------------------------------------
# torch.compile: longrope traces whole; dynamic NTK raises with fullgraph=True and runs eagerly without
# ----------------------------------------------------------------------------------------------------------


@needs_compile
def test_longrope_compiles_with_fullgraph() -> None:
    torch._dynamo.reset()
    rope = RotaryEmbedding(16, layout="half", scaling=LONGROPE, max_len=48)
    compiled = torch.compile(rope, backend="eager", fullgraph=True)
    q = torch.randn(1, 2, 10, 16)
    for kwargs in ({"offset": 0}, {"offset": 30}, {"positions": torch.arange(10)},
                   {"positions": torch.arange(25, 35)}):  # fmt: skip
        got, want = compiled(q, q, **kwargs), rope(q, q, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), kwargs
    short, long = (
        rotary_frequencies(16, scaling=LONGROPE, seq_len=n)[0] for n in (32, 33)
    )
    # the two calls above crossing 32 took the long factors, which differ
    assert not torch.equal(short, long)
    torch._dynamo.reset()


@needs_compile
def test_dynamic_ntk_under_compile_with_and_without_fullgraph() -> None:
    torch._dynamo.reset()
    q = torch.randn(1, 2, 100, 16)
    eager = RotaryEmbedding(16, scaling=DYNAMIC)
    want = eager(q, q)
    whole = torch.compile(
        RotaryEmbedding(16, scaling=DYNAMIC), backend="eager", fullgraph=True
    )
    with pytest.raises(
        Exception, match="changes its frequencies with the sequence length"
    ):
        whole(q, q)
    rope = RotaryEmbedding(16, scaling=DYNAMIC)
    # without fullgraph, dynamo breaks the graph: eager mode's result and state
    split = torch.compile(rope, backend="eager")
    got = split(q, q)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert rope._seq_len == eager._seq_len == 100
    torch._dynamo.reset()
