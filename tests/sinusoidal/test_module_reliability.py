"""Reliability of ``posenc.PositionalEncoding`` where positional encodings break in practice: incremental decoding,
context-parallel shards, packing and left padding, checkpoints across ``max_len`` and devices, dtype and device
casts, eight threads sharing one module, and every bad input (the cases live in ``tests/references/bad_inputs.py``,
which the chapter ``book/13_reliability.ipynb`` prints as a table). Distributed training is in
``tests/deployment/test_ddp.py``.
"""

from __future__ import annotations

import io
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from posenc import PositionalEncoding, sinusoidal_encoding
from tests.references.bad_inputs import CASES, BadInput
from tests.references.classic import (
    LabmlPositionalEncoding,
    SpotpythonPositionalEncoding,
)

BATCH_FIRST = [False, True]
LAYOUTS = ["interleaved", "half"]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _x(
    seq_len: int,
    batch: int,
    d_model: int,
    batch_first: bool,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    shape = (batch, seq_len, d_model) if batch_first else (seq_len, batch, d_model)
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seq_len), dtype=torch.float64
    ).to(dtype)


def _seq(x: torch.Tensor, start: int, stop: int, batch_first: bool) -> torch.Tensor:
    return x[:, start:stop] if batch_first else x[start:stop]


def _cat(parts: list[torch.Tensor], batch_first: bool) -> torch.Tensor:
    return torch.cat(parts, dim=1 if batch_first else 0)


# ---------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_token_by_token_equals_full_forward_bitwise(
    batch_first: bool, layout: str, dtype: torch.dtype
) -> None:
    # max_len=24 < 40 tokens: decoding crosses from the cached table into on-the-fly rows
    module = PositionalEncoding(
        18, max_len=24, batch_first=batch_first, layout=layout
    ).eval()
    x = _x(40, 3, 18, batch_first, dtype)
    full = module(x)
    steps = [module(_seq(x, t, t + 1, batch_first), offset=t) for t in range(40)]
    assert torch.equal(_cat(steps, batch_first), full)


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunked_prefill_then_decoding_equals_full_forward_bitwise(
    batch_first: bool, layout: str
) -> None:
    # a prompt in uneven chunks, then single tokens, with a fresh module (empty cache) for the incremental run
    x = _x(70, 2, 32, batch_first)
    full = PositionalEncoding(32, max_len=50, batch_first=batch_first, layout=layout)(x)
    module = PositionalEncoding(32, max_len=50, batch_first=batch_first, layout=layout)
    bounds = [0, 5, 6, 19, 48, 52, *range(53, 71)]
    parts = [
        module(_seq(x, a, b, batch_first), offset=a) for a, b in zip(bounds, bounds[1:])
    ]
    assert torch.equal(_cat(parts, batch_first), full)


def test_offset_accepts_python_numpy_and_tensor_ints() -> None:
    np = pytest.importorskip("numpy")
    module = PositionalEncoding(8)
    x = torch.randn(2, 1, 8)
    expected = module(x, offset=7)
    for offset in (np.int64(7), torch.tensor(7)):
        assert torch.equal(module(x, offset=offset), expected)


# ---------------------------------------------------------------- context-parallel shards


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "bounds", [[0, 25, 50, 75, 100], [0, 1, 33, 34, 99, 100], [0, 100]]
)
def test_contiguous_shards_with_start_offsets_concatenate_to_full(
    batch_first: bool, layout: str, bounds: list[int]
) -> None:
    # each shard on its own "device" (here: its own module, as each rank builds its own) with offset = its start
    x = _x(100, 2, 24, batch_first)
    full = PositionalEncoding(24, max_len=64, batch_first=batch_first, layout=layout)(x)
    shards = [
        PositionalEncoding(24, max_len=64, batch_first=batch_first, layout=layout)(
            _seq(x, a, b, batch_first), offset=a
        )
        for a, b in zip(bounds, bounds[1:])
    ]
    assert torch.equal(_cat(shards, batch_first), full)


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
def test_zigzag_shards_with_explicit_positions(batch_first: bool) -> None:
    # load-balanced context parallelism gives rank r chunks r and 2R-1-r; their positions are not contiguous
    ranks, chunk = 2, 8
    x = _x(2 * ranks * chunk, 2, 16, batch_first)
    module = PositionalEncoding(16, batch_first=batch_first)
    full = module(x)
    for r in range(ranks):
        chunks = [r, 2 * ranks - 1 - r]
        positions = torch.cat(
            [torch.arange(c * chunk, (c + 1) * chunk) for c in chunks]
        )
        local = torch.cat(
            [_seq(x, c * chunk, (c + 1) * chunk, batch_first) for c in chunks],
            dim=1 if batch_first else 0,
        )
        expected = torch.cat(
            [_seq(full, c * chunk, (c + 1) * chunk, batch_first) for c in chunks],
            dim=1 if batch_first else 0,
        )
        assert torch.equal(module(local, positions=positions), expected)


# ---------------------------------------------------------------- packing and left padding


def _packed_positions(lengths_per_row: list[list[int]]) -> torch.Tensor:
    return torch.stack(
        [torch.cat([torch.arange(n) for n in row]) for row in lengths_per_row]
    )


def _left_padded_positions(lengths: list[int], seq_len: int) -> torch.Tensor:
    # as Hugging Face builds them: cumsum of the attention mask - 1, padding clamped to position 0
    mask = torch.stack(
        [torch.cat([torch.zeros(seq_len - n), torch.ones(n)]) for n in lengths]
    ).long()
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["packed", "left-padded"])
def test_per_sequence_positions_match_the_function(
    batch_first: bool, layout: str, kind: str
) -> None:
    if kind == "packed":
        positions = _packed_positions(
            [[5, 3, 4], [12], [1, 1, 10]]
        )  # [batch=3, seq_len=12]
    else:
        positions = _left_padded_positions([12, 7, 1], 12)
    module = PositionalEncoding(20, max_len=8, batch_first=batch_first, layout=layout)
    x = _x(12, 3, 20, batch_first)
    pe = sinusoidal_encoding(positions, 20, layout=layout)  # [batch, seq_len, d_model]
    expected = x + (pe if batch_first else pe.transpose(0, 1))
    assert torch.equal(module(x, positions=positions), expected)


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
def test_packed_document_equals_the_document_alone(batch_first: bool) -> None:
    # document 2 of row 0 (positions 0..3 at columns 8..11) gets what it gets when encoded alone with offset 0
    positions = _packed_positions([[5, 3, 4], [12]])
    module = PositionalEncoding(16, batch_first=batch_first)
    x = _x(12, 2, 16, batch_first)
    out = module(x, positions=positions)
    row0 = (lambda t: t[0:1]) if batch_first else (lambda t: t[:, 0:1])
    alone = module(_seq(row0(x), 8, 12, batch_first))
    assert torch.equal(_seq(row0(out), 8, 12, batch_first), alone)


def test_left_padded_sequence_equals_the_unpadded_one() -> None:
    module = PositionalEncoding(16, batch_first=True)
    tokens = torch.randn(1, 5, 16)
    padded = torch.cat([torch.zeros(1, 3, 16), tokens], dim=1)
    out = module(padded, positions=_left_padded_positions([5], 8))
    assert torch.equal(out[:, 3:], module(tokens))


@pytest.mark.parametrize("batch_first", BATCH_FIRST)
def test_left_padded_batch_decoded_token_by_token_with_per_row_positions(
    batch_first: bool,
) -> None:
    # prefill a left-padded batch, then decode: each row's next position is its own length so far
    lengths, prompt, new = [6, 2, 4], 6, 5
    positions = _left_padded_positions(lengths, prompt)  # [batch, prompt]
    full_positions = torch.cat(
        [positions, positions[:, -1:] + 1 + torch.arange(new)], dim=1
    )  # [batch, prompt + new]
    module = PositionalEncoding(16, max_len=8, batch_first=batch_first)
    x = _x(prompt + new, 3, 16, batch_first)
    full = module(x, positions=full_positions)
    parts = [module(_seq(x, 0, prompt, batch_first), positions=positions)]
    for t in range(prompt, prompt + new):
        parts.append(
            module(
                _seq(x, t, t + 1, batch_first), positions=full_positions[:, t : t + 1]
            )
        )
    assert torch.equal(_cat(parts, batch_first), full)


# ---------------------------------------------------------------- checkpoints, devices, dtypes


class _Model(nn.Module):
    def __init__(self, positional: nn.Module) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.positional = positional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.positional(self.proj(x))


def _saved(model: nn.Module) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def test_posenc_checkpoint_loads_into_a_different_max_len() -> None:
    torch.manual_seed(0)
    saved = _Model(PositionalEncoding(16, max_len=5000))
    buffer = _saved(saved)
    assert buffer.getbuffer().nbytes < 4096  # weights only: no table in the checkpoint
    loaded = _Model(PositionalEncoding(16, max_len=32))
    assert not torch.equal(
        loaded.proj.weight, saved.proj.weight
    )  # another initialisation
    result = loaded.load_state_dict(torch.load(buffer), strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert torch.equal(loaded.proj.weight, saved.proj.weight)
    for seq_len in (10, 32, 100):  # inside and beyond the new, smaller cache
        x = torch.randn(seq_len, 2, 16)
        assert torch.equal(loaded(x), saved(x))


def test_posenc_checkpoint_onto_the_meta_device() -> None:
    # "another device" without a GPU: map the checkpoint to meta and assign it into a model built on meta
    saved = _Model(PositionalEncoding(16))
    state = torch.load(_saved(saved), map_location="meta")
    assert all(t.device.type == "meta" for t in state.values())
    with torch.device("meta"):
        model = _Model(PositionalEncoding(16, max_len=8))
    model.load_state_dict(state, strict=True, assign=True)
    out = model(torch.empty(20, 2, 16, device="meta"))
    assert out.device.type == "meta" and out.shape == (20, 2, 16)


def test_meta_init_then_to_empty_then_load() -> None:
    # the large-model flow: build on meta (no memory), materialise with to_empty, then load the weights
    torch.manual_seed(0)
    reference = _Model(PositionalEncoding(16)).eval()
    with torch.device("meta"):
        model = _Model(PositionalEncoding(16, max_len=8))
    model(
        torch.empty(4, 2, 16, device="meta")
    )  # a shape-inference pass caches a meta table
    model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(12, 2, 16)
    assert torch.equal(
        model.eval()(x), reference(x)
    )  # the meta table is never used for CPU inputs


@pytest.mark.parametrize(
    "classic", [LabmlPositionalEncoding, SpotpythonPositionalEncoding]
)
def test_classic_checkpoints_load_strictly(classic: type[nn.Module]) -> None:
    torch.manual_seed(0)
    old = _Model(classic(16, 0.0)).eval()
    state = torch.load(
        _saved(old)
    )  # through a file, as users do (weights_only loading)
    new = _Model(PositionalEncoding(16, max_len=64)).eval()
    result = new.load_state_dict(state, strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert torch.equal(
        new.proj.bias, old.proj.bias
    )  # the weights loaded, the table dropped
    x = torch.randn(50, 2, 16)
    assert (new(x) - old(x)).abs().max().item() < 1e-5


def test_posenc_checkpoint_into_spotpython_needs_strict_false() -> None:
    # the other direction: spotpython's table is persistent, so its module expects the key 'pe'
    state = _Model(PositionalEncoding(16)).state_dict()
    with pytest.raises(RuntimeError, match=r"positional\.pe"):
        _Model(SpotpythonPositionalEncoding(16, 0.0)).load_state_dict(
            state, strict=True
        )
    result = _Model(SpotpythonPositionalEncoding(16, 0.0)).load_state_dict(
        state, strict=False
    )
    assert result.missing_keys == ["positional.pe"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_dtype_casts_follow_x(dtype: torch.dtype) -> None:
    model = _Model(PositionalEncoding(16, max_len=8)).to(dtype)
    for seq_len in (6, 12):  # from the cache (max_len 8), then beyond it
        x = torch.randn(seq_len, 2, 16, dtype=dtype)
        out = model(x)
        assert out.dtype == dtype
        expected = model.proj(x) + sinusoidal_encoding(
            seq_len, 16, dtype=dtype
        ).unsqueeze(1)
        assert torch.equal(out, expected)
    assert list(model.positional._tables) == [(torch.device("cpu"), dtype)]


def test_to_meta_device_works() -> None:
    module = PositionalEncoding(16).to("meta")
    out = module(torch.empty(5, 2, 16, device="meta"), offset=3)
    assert out.device.type == "meta" and out.shape == (5, 2, 16)


@pytest.mark.gpu
def test_cuda_checkpoint_roundtrip_and_outputs() -> None:
    torch.manual_seed(0)
    cpu_model = _Model(PositionalEncoding(16, max_len=64)).eval()
    cuda_model = _Model(PositionalEncoding(16, max_len=8)).cuda().eval()
    cuda_model.load_state_dict(
        torch.load(_saved(cpu_model), map_location="cuda"), strict=True
    )
    x = torch.randn(100, 2, 16)
    out = cuda_model(x.cuda())
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), cpu_model(x), rtol=0, atol=1e-6)
    # and back: a checkpoint saved on CUDA loads on the CPU
    back = _Model(PositionalEncoding(16)).eval()
    back.load_state_dict(
        torch.load(_saved(cuda_model), map_location="cpu"), strict=True
    )
    torch.testing.assert_close(back(x), cpu_model(x), rtol=0, atol=0)
    # the per-device cache: one table per (device, dtype) actually used
    assert {key[0].type for key in cuda_model.positional._tables} == {"cuda"}
    # incremental decoding on CUDA is still bitwise
    full = cuda_model.positional(x.cuda())
    steps = torch.cat(
        [cuda_model.positional(x[t : t + 1].cuda(), offset=t) for t in range(100)]
    )
    assert torch.equal(steps, full)


# Pickling the whole module (torch.save(model), copy.deepcopy) must not carry the cache (a regression test:
# it once added 10.2 MB at d_model=512 and left a table under a stale (device, dtype) key after map_location).


def test_whole_module_pickle_carries_no_cached_table() -> None:
    module = PositionalEncoding(512)
    module(
        torch.zeros(3, 1, 512)
    )  # fills the cache with a [5000, 1, 512] float32 table
    buffer = io.BytesIO()
    torch.save(module, buffer)
    assert buffer.tell() < 100_000, f"torch.save(module) wrote {buffer.tell()} bytes"


def test_whole_module_loaded_with_map_location_runs_on_its_devices() -> None:
    module = PositionalEncoding(16)
    x = torch.randn(3, 1, 16)
    expected = module(x)  # caches a (cpu, float32) table
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(
        buffer, map_location="meta", weights_only=False
    )  # stands for map_location="cuda"
    assert loaded._tables == {}
    assert torch.equal(
        loaded(x), expected
    )  # the (cpu, float32) table is rebuilt, not a stale meta tensor


def test_explicit_positions_on_the_meta_device() -> None:
    # shape inference on meta with positions: the negativity check is skipped where values are unknown
    module = PositionalEncoding(16).to("meta")
    out = module(
        torch.empty(3, 2, 16, device="meta"), positions=torch.arange(3, device="meta")
    )
    assert out.device.type == "meta" and out.shape == (3, 2, 16)


# ---------------------------------------------------------------- concurrency

#: (seq_len, offset, dtype) per thread; max_len = 32, so some calls are served by the cache, some computed on the fly
THREAD_CALLS = [
    (1, 0, torch.float32),
    (7, 3, torch.float32),
    (32, 0, torch.float32),
    (33, 0, torch.float32),
    (20, 30, torch.float64),
    (100, 0, torch.float64),
    (5, 27, torch.bfloat16),
    (64, 200, torch.float32),
]


def _thread_inputs() -> list[torch.Tensor]:
    return [
        torch.randn(n, 2, 16, generator=torch.Generator().manual_seed(i)).to(dtype)
        for i, (n, _, dtype) in enumerate(THREAD_CALLS)
    ]


def test_eight_threads_share_one_module() -> None:
    inputs = _thread_inputs()
    expected = [
        PositionalEncoding(16, max_len=32)(x, offset=k)
        for x, (_, k, _) in zip(inputs, THREAD_CALLS)
    ]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to provoke races
    try:
        for _ in range(
            10
        ):  # fresh module each round: the threads race to fill its empty cache
            module = PositionalEncoding(16, max_len=32)
            barrier = threading.Barrier(len(THREAD_CALLS))

            def call(
                i: int,
                module: PositionalEncoding = module,
                barrier: threading.Barrier = barrier,
            ) -> list:
                barrier.wait()
                return [module(inputs[i], offset=THREAD_CALLS[i][1]) for _ in range(5)]

            with ThreadPoolExecutor(len(THREAD_CALLS)) as pool:
                results = list(pool.map(call, range(len(THREAD_CALLS))))
            for i, outs in enumerate(results):
                assert all(torch.equal(out, expected[i]) for out in outs), THREAD_CALLS[
                    i
                ]
            # the only shared state forward writes: one complete, correct table per (device, dtype) used
            # (only calls that end within max_len use the cache; the others compute their rows and store nothing)
            cached = {
                (torch.device("cpu"), d) for n, k, d in THREAD_CALLS if k + n <= 32
            }
            assert (
                set(module._tables)
                == cached
                == {
                    (torch.device("cpu"), torch.float32),
                    (torch.device("cpu"), torch.bfloat16),
                }
            )
            for (_, dtype), table in module._tables.items():
                assert torch.equal(
                    table, sinusoidal_encoding(32, 16, dtype=dtype).unsqueeze(1)
                )
    finally:
        sys.setswitchinterval(previous)


def test_threads_with_explicit_positions_and_batch_first() -> None:
    module = PositionalEncoding(16, max_len=16, batch_first=True)
    inputs = [
        torch.randn(2, n, 16, generator=torch.Generator().manual_seed(n))
        for n in (3, 9, 17, 40)
    ]
    positions = [
        torch.randint(
            0, 100, (2, x.shape[1]), generator=torch.Generator().manual_seed(7)
        )
        for x in inputs
    ]
    expected = [x + sinusoidal_encoding(p, 16) for x, p in zip(inputs, positions)]
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda i: module(inputs[i % 4], positions=positions[i % 4]), range(64)
            )
        )
    assert all(torch.equal(out, expected[i % 4]) for i, out in enumerate(results))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_raises_a_message_that_names_the_argument(case: BadInput) -> None:
    with pytest.raises(case.error, match=case.match) as info:
        case.call()
    assert case.given in str(info.value), (
        f"the message should repeat the bad value {case.given!r}: {info.value}"
    )


def test_bad_input_cases_are_distinct_and_cover_the_foundation_list() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    text = " ".join(names)
    for required in ("d_model", "dropout_prob", "base", "x 2-D", "x's last dim", "x int64", "offset=-1",
                     "positions float", "positions negative", "positions [seq_len + 1]"):  # fmt: skip
        assert required in text, required


def test_the_classic_module_silently_accepts_what_posenc_rejects() -> None:
    # the chapter's table shows these in its "classic module" column
    classic = SpotpythonPositionalEncoding(16, 0.0, max_len=64)
    assert classic(torch.zeros(10, 16)).shape == (
        10,
        10,
        16,
    )  # [seq_len, d_model] broadcast against the table
    assert classic(torch.zeros(3, 1, 2, 16)).shape == (3, 3, 2, 16)
    assert (
        classic(torch.zeros(3, 2, 16, dtype=torch.long)).dtype == torch.float32
    )  # token ids, not embeddings
