"""posenc.PositionalEncoding and get_positional_encoding: drop-in equality with the classic modules (labml's,
spotpython's, the PyTorch tutorial's, whose language model runs unchanged with posenc swapped in), layouts, long
sequences, offsets, explicit positions, dtypes, dropout, the cache and checkpoints; every setting against Python's
math module, outputs and gradients pinned bitwise, read-only settings, checkpoint tables that must not be dropped,
and no host synchronisation on an accelerator."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor, nn
from torch.nn import TransformerEncoder, TransformerEncoderLayer

import posenc.sinusoidal.module
from posenc import PositionalEncoding, get_positional_encoding, sinusoidal_encoding
from tests.references.classic import (
    LabmlPositionalEncoding,
    SpotpythonPositionalEncoding,
    TutorialPositionalEncoding,
    labml_get_positional_encoding,
)
from tests.references.exact import round_once as single_rounding
from tests.references.floors import needs_fake_accelerator
from tests.references.host_syncs import DEVICE, host_syncs


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# --- drop-in ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "classic_cls",
    [LabmlPositionalEncoding, SpotpythonPositionalEncoding, TutorialPositionalEncoding],
)
@pytest.mark.parametrize("d_model", [2, 16, 512])
def test_same_outputs_as_the_classic_modules_below_position_256(
    classic_cls: type[nn.Module], d_model: int
) -> None:
    x = torch.randn(256, 3, d_model)
    classic = classic_cls(d_model, 0.1, max_len=300).eval()
    ours = PositionalEncoding(d_model, 0.1, max_len=300).eval()
    difference = (ours(x) - classic(x)).abs()
    # The classic recipe forms w_i = exp(-2i log(base)/d) and p * w_i in float32: each carries a relative error
    # of a few 2^-24, so at p < 256 its angles (and values) are off by up to ~256 * 6e-8 = 1.5e-5 (measured:
    # 3.9e-6 at d_model=16, 1.41e-5 from d_model=128 on). posenc is exact to float32 rounding, so the difference
    # is the classic recipe's own error plus the rounding of the sums (|x| < 5: 2 * 2^-22).
    classic_error = (classic(torch.zeros(256, 1, d_model)) - sinusoidal_encoding(256, d_model, dtype=torch.float64)
                     .unsqueeze(1).float()).abs()  # fmt: skip
    assert (difference <= classic_error + 5e-7).all()
    assert difference.max() < 1.5e-5


def test_same_table_as_labml_get_positional_encoding() -> None:
    ours, classic = (
        get_positional_encoding(64, 256),
        labml_get_positional_encoding(64, 256),
    )
    assert ours.shape == classic.shape == (256, 1, 64) and ours.dtype == torch.float32
    assert (ours - classic).abs().max() < 1e-5
    assert get_positional_encoding(64).shape == (5000, 1, 64)


def test_spotpython_documented_example() -> None:
    """spotpython documents a (1, 3, 10) input whose rows hold 0, 1, 2 and an output of 0,1,0,1 added to each."""
    x = torch.zeros(1, 3, 10)
    for i in range(3):
        x[0, i, :] = i
    out = PositionalEncoding(d_model=10, dropout_prob=0)(x)
    expected = torch.tensor([[i, i + 1.0] * 5 for i in range(3)]).unsqueeze(0)
    assert torch.equal(out, expected)
    assert torch.equal(out, SpotpythonPositionalEncoding(10, 0)(x))
    # the pitfall: sequence-first, that is one position; batch_first reads it as three positions
    batch_first = PositionalEncoding(d_model=10, batch_first=True)(x)
    assert torch.equal(batch_first[0], x[0] + sinusoidal_encoding(3, 10))


def test_constructor_signature_is_positional_compatible() -> None:
    module = PositionalEncoding(32, 0.2, 100)
    assert (module.d_model, module.dropout.p, module.max_len) == (32, 0.2, 100)
    assert isinstance(module.dropout, nn.Dropout)


def test_the_tutorials_dropout_keyword_is_accepted() -> None:
    """The PyTorch tutorial's module takes ``dropout=``, labml's and spotpython's ``dropout_prob=``: either works,
    both at once is an error that names both, and neither means no dropout."""
    assert PositionalEncoding(32, dropout=0.3).dropout.p == 0.3
    assert PositionalEncoding(32, dropout=0.3, max_len=7).max_len == 7
    assert PositionalEncoding(32, dropout_prob=0.3).dropout.p == 0.3
    assert PositionalEncoding(32).dropout.p == 0.0
    with pytest.raises(TypeError, match=r"dropout_prob=0\.1 and dropout=0\.2"):
        PositionalEncoding(32, 0.1, dropout=0.2)
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\], got 1\.5"):
        PositionalEncoding(32, dropout=1.5)


def tutorial_language_model(PositionalEncoding: type[nn.Module]) -> type[nn.Module]:
    """The model of the PyTorch tutorial "Language Modeling with nn.Transformer" (``TransformerModel``), its code
    as the tutorial writes it, with ``PositionalEncoding`` bound to the class given: the tutorial's own or posenc's.
    It builds the module as ``PositionalEncoding(d_model, dropout=dropout)`` (the tutorial passes ``dropout``
    positionally, which posenc always accepted) and feeds it ``[seq_len, batch, d_model]``."""

    class TransformerModel(nn.Module):
        def __init__(
            self,
            ntoken: int,
            d_model: int,
            nhead: int,
            d_hid: int,
            nlayers: int,
            dropout: float = 0.5,
        ) -> None:
            super().__init__()
            self.model_type = "Transformer"
            self.pos_encoder = PositionalEncoding(d_model, dropout=dropout)
            encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
            self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
            self.embedding = nn.Embedding(ntoken, d_model)
            self.d_model = d_model
            self.linear = nn.Linear(d_model, ntoken)
            self.init_weights()

        def init_weights(self) -> None:
            initrange = 0.1
            self.embedding.weight.data.uniform_(-initrange, initrange)
            self.linear.bias.data.zero_()
            self.linear.weight.data.uniform_(-initrange, initrange)

        def forward(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
            """src: ``[seq_len, batch]`` token ids -> ``[seq_len, batch, ntoken]``."""
            src = self.embedding(src) * math.sqrt(self.d_model)
            src = self.pos_encoder(src)
            output = self.transformer_encoder(src, src_mask)
            output = self.linear(output)
            return output

    return TransformerModel


# the tutorial's TransformerEncoder (batch_first=False) warns that it cannot use nested tensors
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_the_pytorch_tutorials_language_model_runs_with_posenc_swapped_in() -> None:
    """The tutorial's hyperparameters scaled down (its emsize 200 -> 32, bptt 35 kept): the same initial weights,
    the tutorial's checkpoint loads strictly, and eval outputs, a training step's loss (dropout masks drawn in the
    same order) and the weights after the tutorial's SGD step with gradient clipping agree to within the classic
    table's float32 rounding at positions < 35 (measured: 4e-7 on the eval outputs)."""
    args = {"ntoken": 50, "d_model": 32, "nhead": 2, "d_hid": 64, "nlayers": 2}
    models = {}
    for name, positional in (
        ("tutorial", TutorialPositionalEncoding),
        ("posenc", PositionalEncoding),
    ):
        torch.manual_seed(0)
        models[name] = tutorial_language_model(positional)(**args, dropout=0.2)
    tutorial, swapped = models["tutorial"], models["posenc"]
    assert swapped.pos_encoder.dropout.p == 0.2
    state = tutorial.state_dict()
    assert "pos_encoder.pe" in state and "pos_encoder.pe" not in swapped.state_dict()
    result = swapped.load_state_dict(
        state, strict=True
    )  # the tutorial's checkpoint; its table is dropped
    assert result.missing_keys == [] and result.unexpected_keys == []

    data = torch.randint(
        0, 50, (35, 4)
    )  # [seq_len, batch], as the tutorial's get_batch returns
    targets = torch.randint(0, 50, (35 * 4,))
    mask = nn.Transformer.generate_square_subsequent_mask(35)
    with torch.no_grad():
        expected, got = (m.eval()(data, mask) for m in (tutorial, swapped))
    assert got.shape == (35, 4, 50)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    losses = {}
    for name, model in models.items():
        optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
        model.train()
        torch.manual_seed(1)  # the same dropout masks for both
        output = model(data)
        loss = nn.CrossEntropyLoss()(output.view(-1, 50), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        losses[name] = loss.item()
    assert losses["posenc"] == pytest.approx(losses["tutorial"], abs=1e-5)
    for (key, before), after in zip(tutorial.named_parameters(), swapped.parameters()):
        torch.testing.assert_close(after, before, atol=1e-5, rtol=0, msg=key)


# --- layouts and positions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("schedule", ["paper", "tensor2tensor"])
def test_both_batch_layouts_agree_with_the_function(layout: str, schedule: str) -> None:
    x = torch.randn(12, 4, 10)  # [seq, batch, d]
    kwargs = {"layout": layout, "schedule": schedule}
    table = sinusoidal_encoding(12, 10, **kwargs)
    seq_first = PositionalEncoding(10, **kwargs)(x)
    batch_first = PositionalEncoding(10, batch_first=True, **kwargs)(
        x.transpose(0, 1).contiguous()
    )
    assert torch.equal(seq_first, x + table.unsqueeze(1))
    assert torch.equal(batch_first.transpose(0, 1), seq_first)


@pytest.mark.parametrize("batch_first", [False, True])
def test_longer_than_max_len_is_computed_on_the_fly(batch_first: bool) -> None:
    module = PositionalEncoding(8, max_len=10, batch_first=batch_first)
    x = torch.randn(2, 50, 8) if batch_first else torch.randn(50, 2, 8)
    table = sinusoidal_encoding(50, 8)
    expected = x + (table if batch_first else table.unsqueeze(1))
    assert torch.equal(module(x), expected)
    assert all(table.shape[0] == 10 for table in module._tables.values()), (
        "the cache never grows"
    )
    module(x[:5] if not batch_first else x[:, :5])
    assert all(table.shape[0] == 10 for table in module._tables.values())


@pytest.mark.parametrize("batch_first", [False, True])
def test_offset_decoding_equals_the_full_forward_bitwise(batch_first: bool) -> None:
    module = PositionalEncoding(16, max_len=20, batch_first=batch_first).eval()
    seq_axis = 1 if batch_first else 0
    x = torch.randn(3, 30, 16) if batch_first else torch.randn(30, 3, 16)
    full = module(x)
    steps = [
        module(x.narrow(seq_axis, t, 1), offset=t) for t in range(30)
    ]  # crosses max_len at t = 20
    assert torch.equal(torch.cat(steps, dim=seq_axis), full)


def test_explicit_positions_shared_and_per_sequence() -> None:
    x = torch.randn(5, 2, 8)  # [seq, batch, d]
    module = PositionalEncoding(8)
    shared = torch.tensor([4, 3, 2, 1, 0])
    assert torch.equal(
        module(x, positions=shared), x + sinusoidal_encoding(shared, 8).unsqueeze(1)
    )
    per_sequence = torch.tensor(
        [[0, 1, 2, 0, 1], [0, 0, 0, 1, 2]]
    )  # [batch, seq]: packing and left padding
    expected = x + sinusoidal_encoding(per_sequence, 8).transpose(0, 1)
    assert torch.equal(module(x, positions=per_sequence), expected)
    bf = PositionalEncoding(8, batch_first=True)
    xb = x.transpose(0, 1)
    assert torch.equal(
        bf(xb, positions=per_sequence), xb + sinusoidal_encoding(per_sequence, 8)
    )
    assert torch.equal(module(x, positions=torch.arange(5)), module(x)), (
        "arange positions == default"
    )


def test_positions_may_exceed_max_len_and_exclude_offset() -> None:
    module = PositionalEncoding(8, max_len=4)
    x = torch.zeros(3, 1, 8)
    positions = torch.tensor([100, 200, 10**6])
    assert torch.equal(
        module(x, positions=positions), sinusoidal_encoding(positions, 8).unsqueeze(1)
    )
    with pytest.raises(
        ValueError, match=r"either offset or positions, not both \(got offset=7\)"
    ):
        module(x, positions=positions, offset=7)


# --- dtypes, devices, dropout ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_output_follows_x_dtype_with_the_float64_value_rounded_once(
    dtype: torch.dtype,
) -> None:
    module = PositionalEncoding(64, max_len=100)
    x = torch.zeros(300, 2, 64, dtype=dtype)  # beyond max_len too
    out = module(x)
    assert out.dtype == dtype and out.shape == x.shape
    exact = sinusoidal_encoding(300, 64, dtype=torch.float64).numpy()
    # single_rounding: float64 -> dtype in one step (torch's .to goes through float32 for half dtypes)
    expected = torch.from_numpy(single_rounding(exact, dtype)).to(dtype)
    assert torch.equal(out[:, 0], expected), (
        "angles never formed in half precision, rounded once"
    )
    assert torch.equal(
        module(x, offset=2000)[:, 1],
        sinusoidal_encoding(torch.arange(2000, 2300), 64, dtype=dtype),
    )


def test_dropout_only_in_training() -> None:
    module = PositionalEncoding(16, dropout_prob=0.5)
    x = torch.ones(64, 4, 16)
    train = module.train()(x)
    assert (train == 0).float().mean().item() == pytest.approx(0.5, abs=0.05)
    nonzero = train != 0
    assert torch.allclose(
        train[nonzero], (2 * (x + sinusoidal_encoding(64, 16).unsqueeze(1)))[nonzero]
    )
    assert torch.equal(module.eval()(x), x + sinusoidal_encoding(64, 16).unsqueeze(1))


def test_gradient_flows_to_x_only() -> None:
    x = torch.randn(6, 2, 8, requires_grad=True)
    PositionalEncoding(8)(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_meta_device_shapes() -> None:
    out = PositionalEncoding(8)(torch.empty(5, 2, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (5, 2, 8)


# --- cache and checkpoints ----------------------------------------------------------------------------------


def test_nothing_in_state_dict_or_buffers() -> None:
    module = PositionalEncoding(32, 0.1, max_len=100)
    module(torch.zeros(10, 1, 32))
    assert (
        list(module.state_dict()) == []
        and list(module.buffers()) == []
        and list(module.parameters()) == []
    )


def test_one_cached_table_per_device_and_dtype() -> None:
    module = PositionalEncoding(8, max_len=16)
    for dtype in (torch.float32, torch.float32, torch.float64):
        module(torch.zeros(4, 1, 8, dtype=dtype))
    assert set(module._tables) == {
        (torch.device("cpu"), torch.float32),
        (torch.device("cpu"), torch.float64),
    }
    assert module._tables[(torch.device("cpu"), torch.float32)].shape == (16, 1, 8)
    module.to(
        torch.float64
    )  # no buffers: casting the module changes nothing, x's dtype decides
    assert module(torch.zeros(4, 1, 8, dtype=torch.float16)).dtype == torch.float16


@pytest.mark.parametrize(
    "classic_cls",
    [LabmlPositionalEncoding, SpotpythonPositionalEncoding, TutorialPositionalEncoding],
)
def test_classic_checkpoints_load_strictly(classic_cls: type[nn.Module]) -> None:
    class Model(nn.Module):
        def __init__(self, positional: nn.Module) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 16)
            self.pos = positional

    old = Model(classic_cls(16, 0.1, max_len=64))
    state = old.state_dict()
    if classic_cls is LabmlPositionalEncoding:
        # labml's PositionalEncoding saves no table (persistent=False): its state_dict is empty. Its
        # EmbeddingsWithPositionalEncoding saves one under this name; a checkpoint with it loads as well
        assert "pos.positional_encodings" not in state
        state["pos.positional_encodings"] = old.pos.positional_encodings
    new = Model(PositionalEncoding(16, 0.1, max_len=10))
    result = new.load_state_dict(state, strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(new.embed.weight, old.embed.weight)


def test_classic_checkpoint_of_the_wrong_width_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="width 8, this module has d_model=16"):
        PositionalEncoding(16).load_state_dict(
            SpotpythonPositionalEncoding(8, 0.0, max_len=10).state_dict()
        )


def test_a_posenc_checkpoint_loads_into_another_max_len() -> None:
    saved = nn.Sequential(
        nn.Linear(8, 8), PositionalEncoding(8, max_len=5)
    ).state_dict()
    target = nn.Sequential(nn.Linear(8, 8), PositionalEncoding(8, max_len=500))
    assert target.load_state_dict(saved, strict=True).missing_keys == []


def test_repr_names_the_configuration() -> None:
    text = repr(PositionalEncoding(8, 0.1, 64, batch_first=True))
    assert (
        "d_model=8" in text
        and "max_len=64" in text
        and "batch_first=True" in text
        and "p=0.1" in text
    )


def test_docstrings_read_as_plain_text() -> None:
    """help() shows docstrings raw: math is written in plain Unicode (θ, ω_i, 2^-24), never LaTeX."""
    objects = [posenc.sinusoidal.module, PositionalEncoding, get_positional_encoding]
    objects += [PositionalEncoding.forward, PositionalEncoding.encoding]
    for obj in objects:
        doc = obj.__doc__ or ""
        assert "$" not in doc and not re.search(r"\\[A-Za-z]+", doc), obj


# --- pinned values, every setting against an independent reference ------------------------------------------


def frozen_recipe(positions: Tensor, d_model: int) -> Tensor:
    """The float64 table posenc rounds once, computed as posenc computes it (paper frequencies, interleaved):
    ``[*positions.shape, d_model]``. A frozen copy, so that a change of the arithmetic anywhere in posenc (a
    reordered product, another pow) changes a bit somewhere and fails ``test_outputs_and_gradients_are_pinned``."""
    i = torch.arange((d_model + 1) // 2, dtype=torch.float64)
    omega = torch.pow(10000.0, -2.0 * i / d_model)
    angle = positions.to(torch.float64).unsqueeze(-1) * omega
    return torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).flatten(-2)[
        ..., :d_model
    ]


def _pinned(positions: Tensor, d_model: int, dtype: torch.dtype) -> Tensor:
    exact = frozen_recipe(positions, d_model)
    return torch.from_numpy(single_rounding(exact.numpy(), dtype)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes", [None, 4096], ids=["whole", "chunked"])
def test_outputs_and_gradients_are_pinned_bitwise(
    dtype: torch.dtype, chunk_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chapter 08's experiment trains with ``PositionalEncoding(d_model, batch_first=True)`` and explicit
    ``positions``: its outputs and gradients, and those of every other valid use (the cache, offsets, rows past the
    cache, positions shared or per sequence, dropout), are bitwise the frozen recipe's values rounded once, also
    when the rows are built in chunks of a few positions (``chunk_bytes``)."""
    if chunk_bytes is not None:
        monkeypatch.setattr(posenc.sinusoidal.encoding, "CHUNK_BYTES", chunk_bytes)
        assert len(posenc.sinusoidal.encoding._row_ranges(40, 12, 40 * 12 * 4)) > 1, (
            "the rows must come in several chunks"
        )
    d = 12
    bf = PositionalEncoding(d, batch_first=True, max_len=16)
    sf = PositionalEncoding(d, max_len=16)
    x = torch.randn(3, 40, d).to(dtype)  # [batch, seq, d]
    per_row = torch.randint(0, 3000, (3, 40))
    cases = [
        (bf(x, positions=per_row), x + _pinned(per_row, d, dtype)),
        (bf(x, positions=per_row[0]), x + _pinned(per_row[0], d, dtype)),
        (bf(x[:, :10], offset=3), x[:, :10] + _pinned(torch.arange(3, 13), d, dtype)),
        (bf(x), x + _pinned(torch.arange(40), d, dtype)),  # past max_len = 16
        (
            sf(x.transpose(0, 1)).transpose(0, 1),
            x + _pinned(torch.arange(40), d, dtype),
        ),
        (
            sf(x[0, :5, None], offset=5000)[:, 0],
            x[0, :5] + _pinned(torch.arange(5000, 5005), d, dtype),
        ),
    ]
    for i, (got, expected) in enumerate(cases):
        assert torch.equal(got, expected), i
    # the experiment's training step: dropout masks and gradients, against the same expression in plain torch
    train = PositionalEncoding(d, dropout_prob=0.25, batch_first=True).train()
    a, b = (x.float().clone().requires_grad_() for _ in range(2))
    torch.manual_seed(1)
    out = train(a, positions=per_row)
    torch.manual_seed(1)
    reference = nn.functional.dropout(
        b + _pinned(per_row, d, torch.float32), 0.25, training=True
    )
    weight = torch.randn_like(out)
    (out * weight).sum().backward()
    (reference * weight).sum().backward()
    assert torch.equal(out, reference) and torch.equal(a.grad, b.grad)


def python_reference(
    positions: list[int], d_model: int, base: float, layout: str, schedule: str
) -> Tensor:
    """The encoding from its definition with Python's ``math`` (no torch arithmetic): ``[len(positions),
    d_model]`` float64. ``"paper"``: ω_i = base^(-2i/d) for i < ceil(d/2); ``"tensor2tensor"``: ω_i =
    base^(-i/max(d//2 - 1, 1)) for i < d//2, and a 0 appended for odd d (its sine is a zero channel).
    ``"interleaved"``: sin ω_0, cos ω_0, sin ω_1, ..., cut to d; ``"half"``: every sine, then the cosines of
    the d//2 first pairs (tensor2tensor with odd d: the sines and cosines of the d//2 pairs, then the zero)."""
    if schedule == "paper":
        omega = [base ** (-2 * i / d_model) for i in range((d_model + 1) // 2)]
    else:
        m = d_model // 2
        omega = [base ** (-i / max(m - 1, 1)) for i in range(m)] + [0.0] * (d_model % 2)
    rows = []
    for p in positions:
        sin, cos = [math.sin(p * w) for w in omega], [math.cos(p * w) for w in omega]
        if layout == "interleaved":
            row = [v for pair in zip(sin, cos) for v in pair][:d_model]
        elif schedule == "tensor2tensor" and d_model % 2:
            row = sin[:-1] + cos[:-1] + sin[-1:]
        else:
            row = sin + cos[: d_model // 2]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("d_model", [7, 10])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("schedule", ["paper", "tensor2tensor"])
def test_every_setting_against_python_math(
    d_model: int, layout: str, schedule: str
) -> None:
    """Non-default values of every setting (base, max_len, batch_first, layout, frequencies, dropout), in float64
    against ``math.sin`` and ``math.cos``: a module that ignored any of them would fail here."""
    base, max_len, p = 100.0, 6, 0.25
    kwargs = {"base": base, "layout": layout, "schedule": schedule}
    reference = python_reference(
        list(range(12)), d_model, base, layout, schedule
    )  # [12, d]
    seq_first = PositionalEncoding(d_model, p, max_len, **kwargs).eval()
    batch_first = PositionalEncoding(
        d_model, p, max_len, batch_first=True, **kwargs
    ).eval()
    zeros = torch.zeros(4, 3, d_model, dtype=torch.float64)
    # positions 3..6 (crossing max_len = 6), then 0..3 from the cache
    close = dict(rtol=0, atol=1e-13)
    torch.testing.assert_close(
        seq_first(zeros, offset=3), reference[3:7, None].expand(4, 3, d_model), **close
    )
    torch.testing.assert_close(
        batch_first(zeros), reference[None, :3].expand(4, 3, d_model), **close
    )
    positions = torch.tensor(
        [[11, 0, 5], [2, 2, 9], [0, 1, 2], [7, 3, 10]]
    )  # [batch=4, seq=3]
    torch.testing.assert_close(
        batch_first(zeros, positions=positions), reference[positions], **close
    )
    assert [tuple(t.shape) for t in batch_first._tables.values()] == [
        (max_len, d_model)
    ]
    # dropout_prob: in training, a quarter of the entries dropped and the rest scaled by 1 / (1 - p)
    torch.manual_seed(0)
    x = torch.full((12, 64, d_model), 3.0, dtype=torch.float64)  # x + PE is never 0
    dropped = seq_first.train()(x)
    kept = dropped != 0
    assert 0.2 < 1 - kept.double().mean().item() < 0.3
    scaled = ((x + reference[:, None]) / (1 - p))[kept]
    torch.testing.assert_close(dropped[kept], scaled, **close)


# --- read-only settings, pickles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("d_model", 8), ("max_len", 10), ("base", 100.0), ("batch_first", True),
     ("layout", "half"), ("schedule", "tensor2tensor")],
)  # fmt: skip
def test_settings_cannot_change_after_construction(name: str, value: object) -> None:
    """The cached tables follow the settings: an assignment after the first forward is refused, naming the setting
    and the fix, and the module keeps computing what it was built for."""
    module = PositionalEncoding(16, max_len=32)
    x = torch.randn(
        5, 5, 16
    )  # batch == seq_len: a stale batch_first would not even change the shape
    before = module(x)
    with pytest.raises(
        AttributeError, match=rf"{name} is fixed at construction .* {name}={value!r}"
    ):
        setattr(module, name, value)
    assert getattr(module, name) != value and torch.equal(module(x), before)


def test_a_pickle_with_plain_setting_attributes_still_loads() -> None:
    """Pickles of the module made before its settings were read-only hold them as plain attributes."""
    module = PositionalEncoding(16, max_len=32, base=100.0, batch_first=True)
    state = module.__getstate__()
    state.update(state.pop("_settings"))  # the older layout of the instance dictionary
    old = PositionalEncoding.__new__(PositionalEncoding)
    old.__setstate__(state)
    assert (old.d_model, old.max_len, old.base, old.batch_first) == (
        16,
        32,
        100.0,
        True,
    )
    x = torch.randn(2, 40, 16)
    assert torch.equal(old(x), module(x))


# --- checkpoints that must not load silently --------------------------------------------------------------------


def _load_table(
    table: object, module: PositionalEncoding | None = None, key: str = "pe"
) -> object:
    module = module if module is not None else PositionalEncoding(16)
    return module.load_state_dict({key: table}, strict=True)


def test_classic_tables_load_in_any_dtype_and_shape() -> None:
    """spotpython's default table (12,552 positions at d_model = 512, where the classic float32 error is largest),
    and a classic table as saved after ``model.to(dtype)`` and in the shapes classic code stores it: each is this
    module's encoding to within the classic recipe's rounding, so it loads and is dropped."""
    result = _load_table(
        SpotpythonPositionalEncoding(512, 0.0).pe, PositionalEncoding(512)
    )
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    table = TutorialPositionalEncoding(64, 0.0, max_len=3000).pe  # [3000, 1, 64]
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        _load_table(table.to(dtype), PositionalEncoding(64))
    for shaped in (
        table[:, 0],
        table.transpose(0, 1),
    ):  # [max_len, d_model], [1, max_len, d_model]
        _load_table(shaped, PositionalEncoding(64))
    _load_table(
        labml_get_positional_encoding(64, 3000),
        PositionalEncoding(64),
        key="positional_encodings",
    )


#: (what, the table saved as `pe`, what the error says)
FOREIGN_TABLES = [
    (
        "learned",
        nn.Parameter(torch.randn(64, 1, 16) * 0.7),
        r"not this module's sinusoidal encoding",
    ),
    (
        "trained from the sinusoids",
        sinusoidal_encoding(64, 16).unsqueeze(1) + 1e-3,
        r"differs by 0\.001",
    ),
    (
        "another layout",
        sinusoidal_encoding(64, 16, layout="half").unsqueeze(1),
        r"layout='half'",
    ),
    (
        "another base",
        sinusoidal_encoding(64, 16, base=100.0).unsqueeze(1),
        r"not this module's",
    ),
    ("NaN", torch.full((64, 1, 16), float("nan")), r"differs by nan"),
    ("0-d", torch.tensor(1.0), r"got a tensor of shape \(\)"),
    ("a list", [[0.0] * 16], r"got a list"),
    ("1-D", torch.zeros(16), r"got a tensor of shape \(16,\)"),
    ("integers", torch.zeros(64, 1, 16, dtype=torch.long), r"dtype torch\.int64"),
    (
        "another width",
        sinusoidal_encoding(64, 8).unsqueeze(1),
        r"width 8, this module has d_model=16",
    ),
]


@pytest.mark.parametrize(
    ("what", "table", "says"), FOREIGN_TABLES, ids=[c[0] for c in FOREIGN_TABLES]
)
def test_a_table_that_is_not_this_encoding_is_a_load_error(
    what: str, table: object, says: str
) -> None:
    """A checkpoint's ``pe`` that is not this module's encoding (learned values, another layout or base, a
    corrupt entry) would be lost if dropped: ``load_state_dict`` raises an error naming the key and saying what to
    do, with ``strict=False`` too (as torch does for a size mismatch)."""
    for strict in (True, False):
        with pytest.raises(
            RuntimeError, match=r"(?s)\bpe: .*" + says + r".*delete the key"
        ):
            PositionalEncoding(16).load_state_dict({"pe": table}, strict=strict)


def test_a_table_in_another_layout_loads_into_a_module_of_that_layout() -> None:
    table = sinusoidal_encoding(
        64, 16, layout="half", schedule="tensor2tensor"
    ).unsqueeze(1)
    module = PositionalEncoding(16, layout="half", schedule="tensor2tensor")
    assert _load_table(table, module).unexpected_keys == []


def test_a_table_on_the_meta_device_has_no_values_to_compare() -> None:
    result = _load_table(torch.empty(64, 1, 16, device="meta"))
    assert result.unexpected_keys == []


# --- offsets, host synchronisation ------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [2**53 + 1, 2**63 - 1, 2**64])
def test_an_offset_beyond_2_to_the_53_names_offset(offset: int) -> None:
    with pytest.raises(ValueError, match=rf"^offset must be .*2\*\*53.*got {offset}"):
        PositionalEncoding(8)(torch.zeros(2, 1, 8), offset=offset)
    assert PositionalEncoding(8)(torch.zeros(1, 1, 8), offset=2**53).shape == (1, 1, 8)


@needs_fake_accelerator
def test_the_forward_on_an_accelerator_reads_no_value() -> None:
    """On a GPU a value read is a host synchronisation: the forward reads none there (fake accelerator tensors,
    ``tests/references/host_syncs.py``), in every path: the cache, past it, explicit positions, a tensor
    offset, dropout. On the CPU the same values are checked (``tests/references/bad_inputs.py``)."""
    module = PositionalEncoding(16, dropout_prob=0.1, max_len=8)
    x = lambda: torch.zeros(5, 2, 16, device=DEVICE)  # noqa: E731
    calls = {
        "cache": lambda x: module.eval()(x, offset=2),
        "past the cache": lambda x: module.eval()(x, offset=20),
        "positions [seq_len]": lambda x: module.eval()(
            x, positions=torch.arange(5, device=DEVICE)
        ),
        "positions [batch, seq_len]": lambda x: module.eval()(
            x, positions=torch.arange(10, device=DEVICE).view(2, 5)
        ),
        "tensor offset": lambda x: module.eval()(
            x, offset=torch.zeros((), dtype=torch.long, device=DEVICE) + 3
        ),
        "training": lambda x: module.train()(x),
        "training, past the cache": lambda x: module.train()(x, offset=20),
    }
    syncs = {name: host_syncs(call, x) for name, call in calls.items()}
    assert syncs == {name: [] for name in calls}


def test_vmap_and_grad_over_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside torch.func (vmap over sequences and their positions, grad) the values are per sample: none is read,
    no row is written in place, and the results are the plain call's, also where rows come in pieces."""
    monkeypatch.setattr(posenc.sinusoidal.encoding, "CHUNK_BYTES", 1024, raising=False)
    module = PositionalEncoding(8, max_len=4, batch_first=True)
    x, positions = torch.randn(3, 20, 8), torch.randint(0, 100, (3, 20))
    per_sample = torch.func.vmap(lambda xi, pi: module(xi[None], positions=pi)[0])
    assert torch.equal(per_sample(x, positions), module(x, positions=positions))
    assert torch.equal(torch.func.vmap(lambda xi: module(xi[None])[0])(x), module(x))
    grad = torch.func.grad(lambda xi: (module(xi[None]) * x[1]).sum())(x[0])
    assert torch.equal(grad, x[1])
