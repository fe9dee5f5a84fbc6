"""posenc on CUDA: the same values as on CPU for every dtype, the module moved with .to("cuda"), offsets and
explicit positions on the device, and torch.compile / torch.export of a model using the module on the device.

Every test is marked ``gpu``: conftest.py skips them where ``torch.cuda.is_available()`` is False, and
``tools/gpu_check.py`` (``make gpu-check``) runs them with ``python3 -m pytest -m gpu tests/`` on a CUDA machine.
Bounds (the precision chapter's): float32 within 6e-8 of the float64 value; float16 and bfloat16 equal to the float64
value rounded once; float64 within the two-kernel tolerance derived in tests/references/compiled.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc import PositionalEncoding, sinusoidal_encoding
from tests.references.compiled import TinyModel, tolerance

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
FLOAT32_BOUND = 6e-8
# positions spread over the cached range and beyond it (angles up to 2e4 rad), for an even and an odd width
POSITIONS = torch.cat([torch.arange(0, 4096), torch.arange(4096, 20000, 97)])


def assert_encoding_bound(
    actual: torch.Tensor, exact64: torch.Tensor, on_cpu: torch.Tensor, max_angle: float
) -> None:
    """The precision chapter's bound for an encoding against its float64 value (``on_cpu``: the CPU result)."""
    actual, dtype = actual.cpu(), actual.dtype
    if dtype == torch.float32:
        assert (actual.double() - exact64).abs().max().item() <= FLOAT32_BOUND
    elif dtype == torch.float64:
        torch.testing.assert_close(
            actual, exact64, atol=tolerance(dtype, max_angle)["atol"], rtol=0
        )
    else:
        # half precision: the float64 value rounded once, which the CPU result is
        # (tests/sinusoidal/test_encoding_precision.py). Not exact64.to(dtype): Tensor.to goes from
        # float64 to half through float32 and can round twice.
        assert torch.equal(actual, on_cpu)


WIDTHS = [(512, "interleaved", "paper"), (63, "half", "tensor2tensor")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("d_model", "layout", "schedule"), WIDTHS)
def test_sinusoidal_encoding_cuda_matches_cpu(dtype, d_model, layout, schedule):
    kwargs = {"layout": layout, "schedule": schedule}
    exact64 = sinusoidal_encoding(
        POSITIONS, d_model, dtype=torch.float64, **kwargs
    )  # CPU reference
    on_cpu = sinusoidal_encoding(POSITIONS, d_model, dtype=dtype, **kwargs)
    on_cuda = sinusoidal_encoding(POSITIONS.to(CUDA), d_model, dtype=dtype, **kwargs)
    assert on_cuda.device.type == "cuda" and on_cuda.dtype == dtype
    assert_encoding_bound(on_cuda, exact64, on_cpu, max_angle=float(POSITIONS.max()))
    # an int count with device="cuda" gives the same rows
    counted = sinusoidal_encoding(300, d_model, dtype=dtype, device="cuda", **kwargs)
    assert torch.equal(counted, on_cuda[:300])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_module_cuda_matches_cpu(dtype):
    torch.manual_seed(0)
    module = PositionalEncoding(64, dropout_prob=0.1).eval()
    x = torch.randn(300, 4, 64, dtype=torch.float64).to(dtype)
    on_cpu = module(x)
    on_cuda = module(x.to(CUDA))
    assert (
        on_cuda.device.type == "cuda"
        and on_cuda.dtype == dtype
        and on_cuda.shape == x.shape
    )
    if dtype in (torch.float16, torch.bfloat16):
        # the same table (float64 rounded once) and an add computed in float32 then rounded: bitwise equal
        assert torch.equal(on_cuda.cpu(), on_cpu)
    else:
        torch.testing.assert_close(
            on_cuda.cpu(), on_cpu, **tolerance(dtype, max_angle=300)
        )
    assert (torch.device("cuda", torch.cuda.current_device()), dtype) in module._tables


def test_module_moved_with_to_cuda():
    module = PositionalEncoding(32, dropout_prob=0.2, max_len=128)
    module.to(
        "cuda"
    )  # no buffers: nothing to move, the cache fills per device on first use
    assert module.state_dict() == {}
    x = torch.randn(50, 2, 32, device=CUDA)
    out = module.eval()(x)
    assert out.device == x.device
    expected = x.cpu() + sinusoidal_encoding(50, 32).unsqueeze(1)
    torch.testing.assert_close(
        out.cpu(), expected, **tolerance(torch.float32, max_angle=50)
    )
    module.train()
    torch.manual_seed(0)
    dropped = module(torch.ones(50, 2, 32, device=CUDA))
    kept = dropped != 0
    assert (
        0 < kept.float().mean().item() < 1
    )  # dropout active in training mode, on the device


def test_offset_and_positions_on_cuda():
    module = PositionalEncoding(48, batch_first=True).eval()
    x = torch.randn(3, 20, 48)
    positions = torch.tensor(
        [list(range(20)), list(range(100, 120)), [0, 1, 2, 3, 0, 1, 2, 3, *range(12)]]
    )
    tol = tolerance(torch.float32, max_angle=6020)
    for offset in (
        0,
        7,
        4990,
        6000,
    ):  # 6000: past max_len, computed on the fly on the device
        torch.testing.assert_close(
            module(x.to(CUDA), offset=offset).cpu(), module(x, offset=offset), **tol
        )
    expected = module(x, positions=positions)
    torch.testing.assert_close(
        module(x.to(CUDA), positions=positions.to(CUDA)).cpu(), expected, **tol
    )
    # x on CUDA with positions left on CPU: handled (the positions are moved to x's device)
    mixed = module(x.to(CUDA), positions=positions)
    assert mixed.device.type == "cuda"
    assert torch.equal(mixed, module(x.to(CUDA), positions=positions.to(CUDA)))


def test_tokens_by_one_with_offset_equal_full_forward_on_cuda():
    module = PositionalEncoding(16, max_len=8).eval()
    x = torch.randn(20, 2, 16, device=CUDA)
    steps = torch.cat([module(x[t : t + 1], offset=t) for t in range(20)])
    assert torch.equal(steps, module(x))


def test_compiled_model_on_cuda_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyModel(max_len=64).to(CUDA).eval()
    compiled = torch.compile(model, fullgraph=True)
    for seq_len in (
        16,
        33,
        50,
        90,
    ):  # 90 > max_len: the encoding is computed inside the graph
        tokens = torch.randint(0, 50, (seq_len, 3), device=CUDA)
        torch.testing.assert_close(
            compiled(tokens), model(tokens), atol=1e-5, rtol=1e-5
        )
    # the module alone, compiled, adds the same cached rows as eager mode: bitwise equal
    pe = model.pe
    compiled_pe = torch.compile(pe, fullgraph=True, dynamic=True)
    for seq_len, offset in ((5, 0), (12, 3), (40, 20)):
        x = torch.randn(seq_len, 3, 16, device=CUDA)
        assert torch.equal(compiled_pe(x, offset=offset), pe(x, offset=offset))


def test_compiled_with_cuda_graphs_matches_eager():
    torch._dynamo.reset()
    module = PositionalEncoding(64).to(CUDA).eval()
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(128, 4, 64, device=CUDA)
    expected = module(x)
    for _ in range(
        4
    ):  # warmed up, recorded, then replayed (each output checked before the next replay)
        assert torch.equal(compiled(x), expected)


def test_compiled_half_precision_on_cuda():
    torch._dynamo.reset()
    module = PositionalEncoding(64).to(CUDA).eval()
    compiled = torch.compile(module, fullgraph=True)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(100, 2, 64, device=CUDA, dtype=dtype)
        assert torch.equal(compiled(x), module(x))


def test_export_on_cuda_matches_eager():
    torch.manual_seed(0)
    model = TinyModel(max_len=32).to(CUDA).eval()
    seq = torch.export.Dim("seq", min=2, max=4096)
    tokens = torch.randint(0, 50, (6, 2), device=CUDA)
    program = torch.export.export(model, (tokens,), dynamic_shapes={"tokens": {0: seq}})
    for seq_len in (3, 40, 500):
        tokens = torch.randint(0, 50, (seq_len, 2), device=CUDA)
        torch.testing.assert_close(
            program.module()(tokens), model(tokens), atol=1e-5, rtol=1e-5
        )


def test_classic_checkpoint_loads_into_a_cuda_module():
    from tests.references.classic import SpotpythonPositionalEncoding

    model = nn.Sequential(nn.Linear(16, 16), PositionalEncoding(16)).to(CUDA)
    old = nn.Sequential(nn.Linear(16, 16), SpotpythonPositionalEncoding(16, 0.1)).to(
        CUDA
    )
    assert not model.load_state_dict(old.state_dict(), strict=True).missing_keys
