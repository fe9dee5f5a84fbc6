"""Conventions in the wild (book/05_conventions.ipynb): the published sinusoidal tables, each restated here from its
source in plain float64 code, are reproduced by posenc's ``layout=`` / ``schedule=`` / ``base=`` keywords to
float64 precision, odd widths included; the two layouts are a fixed channel permutation; the two schedules differ
as derived. Restated (not copied) from:

- fairseq ``SinusoidalPositionalEmbedding.get_embedding`` (also Hugging Face M2M100 / FSMT): half layout, frequencies
  exp(-i ln(10000) / (d//2 - 1)), a zero channel for odd d, row ``padding_idx`` zeroed;
- tensor2tensor ``common_attention.get_timing_signal_1d``: half layout, inv_timescales min * exp(-i ln(max/min) /
  max(d//2 - 1, 1)), zero padding for odd d, positions ``arange(length) + start_index``;
- Hugging Face ``MarianSinusoidalPositionalEmbedding.create_weight`` (transformers 5.23.0; the same arithmetic was
  ``_init_weight`` in 4.57.6): angles pos / 10000^(2 (j//2) / d) in float64, ceil(d/2) sines then floor(d/2)
  cosines, cast to float32;
- Whisper ``sinusoids``: as tensor2tensor with max_timescale, even d only, in torch's default dtype (no dtype is
  named: float32 by default);
- spotpython's ``PositionalEncoding`` (the PyTorch tutorial's, ``tests/references/classic.py``): the paper's table,
  in torch's default dtype;
- x-transformers ``ScaledSinusoidalEmbedding``: half layout, inv_freq theta^(-i / (d//2)), times a learned scale;
- positional-encodings 6.0.4 ``PositionalEncoding1D`` (``positional_encodings/torch_encodings.py``): channels =
  ceil(d/2) * 2, inv_freq = 1 / 10000^(arange(0, channels, 2) / channels), sin and cos interleaved, cut to d
  channels: for odd d the paper's table of width d + 1 without its last channel, a third odd-width convention that
  posenc reproduces with base = 10000^(d / (d + 1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import PositionalEncoding, frequencies, offset_matrix, sinusoidal_encoding
from tests.references.classic import SpotpythonPositionalEncoding
from tests.references.peers import require

U64 = 2.0**-53  # float64 unit roundoff
bases = st.floats(1.0, 6.0).map(lambda e: 10.0**e)  # log-uniform in [10, 1e6]
position_lists = st.lists(st.integers(0, 2**20), min_size=1, max_size=16)
SETTINGS = settings(
    max_examples=60, deadline=None, database=None
)  # no .hypothesis/ written into the checkout


def peer_tolerance(max_position: int, base: float) -> float:
    """Bound on |peer - posenc| for two float64 evaluations of the same table that compute w_i differently.

    The peer forms w_i = exp(i * -(ln base / c)) (or a power or a division): ln and the division round to
    within 2 U64 relative, the product i * (...) to 3 U64 relative, so the exponent x_i (|x_i| <= ln base) is off by
    <= 3 U64 ln base, and exp adds 2 U64: w_i is within (3 ln base + 2) U64 relative. posenc's
    pow(base, -i / c) has an exponent within U64 and pow within 2 U64: (ln base + 2) U64. Together the w_i differ
    by <= (4 ln base + 4) U64 w_i; each side rounds the angle p w_i (U64 each), so the angles differ by
    <= (4 ln base + 6) U64 p (w_i <= 1), and the sines/cosines add 4 U64. We allow twice the ln term and
    8 U64 for the rest: (8 ln base + 8) U64 p + 2^-50.
    """
    return (8 * math.log(base) + 8) * U64 * max_position + 2**-50


# ----- the published formulas, restated in float64 -------------------------------------------------------------


def fairseq_get_embedding(
    num_embeddings: int, embedding_dim: int, padding_idx: int | None = None
) -> torch.Tensor:
    """fairseq's table: [num_embeddings, embedding_dim] (defined for embedding_dim >= 4)."""
    return fairseq_rows(torch.arange(num_embeddings), embedding_dim, padding_idx)


def fairseq_rows(
    rows: torch.Tensor, embedding_dim: int, padding_idx: int | None = None
) -> torch.Tensor:
    """Rows ``rows`` of fairseq's table, the same arithmetic with arange(num_embeddings) replaced by ``rows``."""
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float64) * -emb)
    emb = rows.to(torch.float64).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(len(rows), -1)
    if embedding_dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(len(rows), 1, dtype=torch.float64)], dim=1)
    if padding_idx is not None:
        emb[rows == padding_idx, :] = 0
    return emb


def t2t_get_timing_signal_1d(
    length: int,
    channels: int,
    min_timescale: float = 1.0,
    max_timescale: float = 1.0e4,
    start_index: int = 0,
) -> np.ndarray:
    """tensor2tensor's timing signal: [1, length, channels]."""
    position = np.arange(length, dtype=np.float64) + start_index
    num_timescales = channels // 2
    log_timescale_increment = math.log(
        float(max_timescale) / float(min_timescale)
    ) / max(float(num_timescales) - 1, 1)
    inv_timescales = min_timescale * np.exp(
        np.arange(num_timescales, dtype=np.float64) * -log_timescale_increment
    )
    scaled_time = np.expand_dims(position, 1) * np.expand_dims(inv_timescales, 0)
    signal = np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1)
    signal = np.pad(signal, [[0, 0], [0, channels % 2]])
    return signal.reshape(1, length, channels)


def marian_create_weight_literal(n_pos: int, dim: int) -> np.ndarray:
    """Marian's create_weight as written (Python loops), before the float32 cast: [n_pos, dim]."""
    position_enc = np.array(
        [
            [pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
            for pos in range(n_pos)
        ]
    )
    out = np.empty((n_pos, dim))
    sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
    out[:, 0:sentinel] = np.sin(position_enc[:, 0::2])
    out[:, sentinel:] = np.cos(position_enc[:, 1::2])
    return out


def marian_rows(rows: np.ndarray, dim: int) -> np.ndarray:
    """Rows ``rows`` of Marian's table, vectorised with the same element-wise arithmetic: [len(rows), dim]."""
    j = np.arange(dim)
    position_enc = (
        rows.astype(np.float64)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
    )
    sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
    out = np.empty((len(rows), dim))
    out[:, 0:sentinel] = np.sin(position_enc[:, 0::2])
    out[:, sentinel:] = np.cos(position_enc[:, 1::2])
    return out


def whisper_sinusoids_rows(
    rows: torch.Tensor, channels: int, max_timescale: float = 10000
) -> torch.Tensor:
    """Rows of Whisper's sinusoids(length, channels, max_timescale) (even channels >= 4): [len(rows), channels]."""
    if channels % 2 != 0:
        raise ValueError("Whisper refuses odd channels")
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(
        -log_timescale_increment * torch.arange(channels // 2, dtype=torch.float64)
    )
    scaled_time = rows.to(torch.float64).view(-1, 1) * inv_timescales.view(1, -1)
    return torch.cat([scaled_time.sin(), scaled_time.cos()], dim=1)


def x_transformers_rows(
    pos: torch.Tensor, dim: int, theta: float = 10000
) -> torch.Tensor:
    """x-transformers' ScaledSinusoidalEmbedding at positions ``pos``, without its learned scale: [len(pos), dim]."""
    half_dim = dim // 2
    freq_seq = torch.arange(half_dim, dtype=torch.float64) / half_dim
    inv_freq = theta**-freq_seq
    emb = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


def whisper_sinusoids_as_written(
    length: int, channels: int, max_timescale: float = 10000
) -> torch.Tensor:
    """Whisper's sinusoids exactly as written, no dtype named (so torch's default dtype): [length, channels]."""
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length).view(-1, 1) * inv_timescales.view(1, -1)
    return torch.cat([scaled_time.sin(), scaled_time.cos()], dim=1)


def positional_encodings_1d_rows(pos: torch.Tensor, org_channels: int) -> torch.Tensor:
    """positional-encodings' PositionalEncoding1D at positions ``pos`` (the package uses arange(seq_len)), in
    float64 where the package uses float32 (``.float()``): [len(pos), org_channels]. The package returns this
    table repeated over the batch, ``[batch, seq_len, org_channels]``."""
    channels = int(np.ceil(org_channels / 2) * 2)
    inv_freq = 1.0 / (
        10000 ** (torch.arange(0, channels, 2, dtype=torch.float64) / channels)
    )
    pos_x = pos.to(torch.float64)
    sin_inp_x = torch.einsum("i,j->ij", pos_x, inv_freq)
    # get_emb: sin and cos of each frequency side by side (interleaved)
    emb = torch.flatten(torch.stack((sin_inp_x.sin(), sin_inp_x.cos()), dim=-1), -2, -1)
    return emb[:, :org_channels]


def posenc_half(
    positions: list[int] | torch.Tensor,
    d_model: int,
    schedule: str,
    base: float = 10000.0,
) -> torch.Tensor:
    return sinusoidal_encoding(
        torch.as_tensor(positions),
        d_model,
        base=base,
        dtype=torch.float64,
        layout="half",
        schedule=schedule,
    )


# ----- reproduction ------------------------------------------------------------------------------------------------


@SETTINGS
@given(d_model=st.integers(4, 1024), rows=position_lists)
def test_fairseq_get_embedding(d_model: int, rows: list[int]) -> None:
    ours = posenc_half(rows, d_model, "tensor2tensor")
    assert (
        fairseq_rows(torch.tensor(rows), d_model) - ours
    ).abs().max().item() <= peer_tolerance(max(rows), 1e4)


@pytest.mark.parametrize("d_model", [4, 5, 6, 7, 16, 33, 512, 1023])
def test_fairseq_table_with_padding_and_its_position_numbering(d_model: int) -> None:
    padding_idx = 1
    table = fairseq_get_embedding(300, d_model, padding_idx)
    ours = posenc_half(torch.arange(300), d_model, "tensor2tensor")
    assert torch.equal(table[padding_idx], torch.zeros(d_model, dtype=torch.float64))
    keep = torch.arange(300) != padding_idx
    assert (table[keep] - ours[keep]).abs().max().item() <= peer_tolerance(300, 1e4)
    # fairseq numbers real tokens from padding_idx + 1: the module with offset = padding_idx + 1 gives those rows
    module = PositionalEncoding(
        d_model, layout="half", schedule="tensor2tensor", batch_first=True
    )
    x = torch.zeros(1, 50, d_model, dtype=torch.float64)
    rows = table[padding_idx + 1 : padding_idx + 51]
    assert (
        module(x, offset=padding_idx + 1)[0] - rows
    ).abs().max().item() <= peer_tolerance(51, 1e4)


@SETTINGS
@given(
    d_model=st.integers(1, 1024),
    base=bases,
    start=st.integers(0, 2**20),
    length=st.integers(1, 8),
)
def test_tensor2tensor_get_timing_signal_1d(
    d_model: int, base: float, start: int, length: int
) -> None:
    signal = t2t_get_timing_signal_1d(
        length, d_model, max_timescale=base, start_index=start
    )
    assert signal.shape == (1, length, d_model)
    ours = posenc_half(
        torch.arange(start, start + length), d_model, "tensor2tensor", base=base
    )
    assert np.abs(signal[0] - ours.numpy()).max() <= peer_tolerance(
        start + length, base
    )


@pytest.mark.parametrize("d_model", [1, 2, 3])
def test_tensor2tensor_smallest_widths(d_model: int) -> None:
    # num_timescales - 1 <= 0 is guarded by max(., 1); channels = 1 is a single zero channel
    signal = t2t_get_timing_signal_1d(100, d_model)[0]
    assert np.abs(
        signal - posenc_half(torch.arange(100), d_model, "tensor2tensor").numpy()
    ).max() <= peer_tolerance(100, 1e4)


@SETTINGS
@given(d_model=st.integers(1, 1024), rows=position_lists)
def test_marian_sinusoidal_table(d_model: int, rows: list[int]) -> None:
    reference = marian_rows(np.array(rows), d_model)
    ours = posenc_half(rows, d_model, "paper")
    # Marian divides by 10000^e instead of multiplying by 10000^-e: one more rounding, inside the same bound
    assert np.abs(reference - ours.numpy()).max() <= peer_tolerance(max(rows), 1e4)
    # Marian rounds its float64 values once to float32, as posenc does: the float32 tables agree to one float32
    # ulp (eps * |v| bounds the ulp of v) plus the float64 discrepancy, which matters only near zero
    marian32 = torch.from_numpy(reference).float().double()
    ours32 = sinusoidal_encoding(torch.tensor(rows), d_model, layout="half").double()
    tolerance = torch.finfo(torch.float32).eps * marian32.abs() + peer_tolerance(
        max(rows), 1e4
    )
    assert bool(((marian32 - ours32).abs() <= tolerance).all())


@pytest.mark.parametrize("d_model", [1, 2, 3, 7, 8, 33])
def test_marian_vectorised_restatement_is_the_literal_one(d_model: int) -> None:
    # the vectorised form used above performs the same element-wise operations as the literal loops
    literal = marian_create_weight_literal(60, d_model)
    assert np.array_equal(marian_rows(np.arange(60), d_model), literal)
    assert np.abs(
        literal - posenc_half(torch.arange(60), d_model, "paper").numpy()
    ).max() <= peer_tolerance(60, 1e4)


@SETTINGS
@given(half=st.integers(2, 512), base=bases, rows=position_lists)
def test_whisper_sinusoids(half: int, base: float, rows: list[int]) -> None:
    d_model = 2 * half
    reference = whisper_sinusoids_rows(torch.tensor(rows), d_model, max_timescale=base)
    ours = posenc_half(rows, d_model, "tensor2tensor", base=base)
    assert (reference - ours).abs().max().item() <= peer_tolerance(max(rows), base)


@SETTINGS
@given(half=st.integers(1, 512), base=bases, rows=position_lists)
def test_x_transformers_scaled_sinusoidal(
    half: int, base: float, rows: list[int]
) -> None:
    d_model = 2 * half
    reference = x_transformers_rows(torch.tensor(rows), d_model, theta=base)
    ours = posenc_half(rows, d_model, "paper", base=base)
    # i / (d/2) and 2i / d are the same rational, each correctly rounded: the same float64 exponent, so only
    # pow's and the angle's roundings differ (if at all)
    assert (reference - ours).abs().max().item() <= peer_tolerance(max(rows), base)


@SETTINGS
@given(d_model=st.integers(1, 1024), rows=position_lists)
def test_positional_encodings_1d(d_model: int, rows: list[int]) -> None:
    # odd d: frequencies 10000^(-2i/(d+1)) = (10000^(d/(d+1)))^(-2i/d), posenc's paper schedule with another base
    p = torch.tensor(rows)
    reference = positional_encodings_1d_rows(p, d_model)
    tolerance = peer_tolerance(max(rows), 1e4)
    base = 10000.0 ** (d_model / (d_model + 1)) if d_model % 2 else 10000.0
    by_base = sinusoidal_encoding(p, d_model, base=base, dtype=torch.float64)
    assert (reference - by_base).abs().max().item() <= tolerance
    # equally: posenc's table of the even width d + d % 2, cut to d channels
    wider = sinusoidal_encoding(p, d_model + d_model % 2, dtype=torch.float64)
    assert (reference - wider[:, :d_model]).abs().max().item() <= tolerance


@pytest.mark.parametrize(("d_model", "first_above_0_1"), [(7, 4), (63, 19), (511, 140)])
def test_positional_encodings_odd_width_is_a_third_convention(
    d_model: int, first_above_0_1: int
) -> None:
    # neither posenc's default odd-width table nor the zero-channel one (both interleaved, like the package's)
    p = torch.arange(2000)
    reference = positional_encodings_1d_rows(p, d_model)
    default = sinusoidal_encoding(p, d_model, dtype=torch.float64)
    t2t = sinusoidal_encoding(p, d_model, dtype=torch.float64, schedule="tensor2tensor")
    gap = (reference - default).abs().amax(-1)
    assert int(torch.nonzero(gap > 0.1)[0]) == first_above_0_1  # the chapter's numbers
    assert (reference - t2t).abs().max().item() > 0.1
    assert not torch.equal(reference[:, -1], torch.zeros(2000, dtype=torch.float64))


@pytest.fixture
def set_default_dtype():
    previous = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_spotpython_and_whisper_follow_the_default_dtype(
    default: torch.dtype, set_default_dtype
) -> None:
    set_default_dtype(default)
    whisper = whisper_sinusoids_as_written(3000, 64)
    spotpython = SpotpythonPositionalEncoding(64, 0.0, max_len=3000).pe[:, 0]
    assert whisper.dtype == spotpython.dtype == default
    p = torch.arange(3000)
    errors = [
        (whisper.double() - posenc_half(p, 64, "tensor2tensor")).abs().max().item(),
        (spotpython.double() - sinusoidal_encoding(p, 64, dtype=torch.float64))
        .abs()
        .max()
        .item(),
    ]
    if default == torch.float64:  # the same tables as posenc's, to float64 rounding
        assert max(errors) <= peer_tolerance(3000, 1e4)
    else:  # float32 angles: far outside the float64 bound
        assert min(errors) > 1e3 * peer_tolerance(3000, 1e4)


# ----- the layouts are a fixed permutation --------------------------------------------------------------------------


def layout_permutation(d_model: int, schedule: str) -> torch.Tensor:
    """perm with half == interleaved[..., perm]: even channels (sines) then odd ones (cosines); with the
    tensor2tensor schedule an odd width's zero channel stays last."""
    channels = torch.arange(d_model)
    if schedule == "tensor2tensor" and d_model % 2:
        m = d_model // 2
        return torch.cat(
            [channels[0 : 2 * m : 2], channels[1 : 2 * m : 2], channels[-1:]]
        )
    return torch.cat([channels[0::2], channels[1::2]])


@SETTINGS
@given(
    d_model=st.integers(1, 1024),
    base=bases,
    positions=position_lists,
    schedule=st.sampled_from(["paper", "tensor2tensor"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_layouts_are_a_fixed_permutation(
    d_model: int, base: float, positions: list[int], schedule: str, dtype: torch.dtype
) -> None:
    # exact: both layouts arrange the same computed sines and cosines
    kwargs = {"base": base, "schedule": schedule, "dtype": dtype}
    p = torch.tensor(positions)
    perm = layout_permutation(d_model, schedule)
    assert sorted(perm.tolist()) == list(range(d_model))
    interleaved = sinusoidal_encoding(p, d_model, layout="interleaved", **kwargs)
    assert torch.equal(
        sinusoidal_encoding(p, d_model, layout="half", **kwargs), interleaved[:, perm]
    )
    m_interleaved = offset_matrix(positions[0], d_model, **kwargs)
    m_half = offset_matrix(positions[0], d_model, layout="half", **kwargs)
    assert torch.equal(m_half, m_interleaved[perm][:, perm])


# ----- the two schedules --------------------------------------------------------------------------------------------


@SETTINGS
@given(d_model=st.integers(4, 1024).filter(lambda d: d % 2 == 0), base=bases)
def test_schedule_ratio(d_model: int, base: float) -> None:
    # w_t2t / w_paper = base^(-4i / (d (d - 2))); each of the three powers is within (ln base + 2) U64 relative
    # (exponent rounding times ln base, plus pow's own error), the division adds U64
    i = torch.arange(d_model // 2, dtype=torch.float64)
    ratio = frequencies(d_model, base=base, schedule="tensor2tensor") / frequencies(
        d_model, base=base
    )
    formula = torch.pow(base, -4 * i / (d_model * (d_model - 2)))
    assert ((ratio - formula).abs() / formula).max().item() <= (
        3 * math.log(base) + 8
    ) * U64
    assert ratio[0] == 1.0
    # the slowest tensor2tensor pair lands on 1/base (to pow's rounding)
    assert (
        abs(
            frequencies(d_model, base=base, schedule="tensor2tensor")[-1].item() * base
            - 1
        )
        <= (math.log(base) + 4) * U64
    )


def test_schedules_are_not_interchangeable() -> None:
    # the chapter's numbers: d_model = 512 tables differ by > 0.1 from p = 71 and by > 1 from p = 732
    p = torch.arange(2000)
    gap = (
        (posenc_half(p, 512, "paper") - posenc_half(p, 512, "tensor2tensor"))
        .abs()
        .amax(-1)
    )
    assert (
        int(torch.nonzero(gap > 0.1)[0]) == 71
        and int(torch.nonzero(gap > 1.0)[0]) == 732
    )


# ----- the keywords on the module, and the defaults ----------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("schedule", ["paper", "tensor2tensor"])
@pytest.mark.parametrize("d_model", [6, 7])
def test_module_keywords_match_the_function(
    layout: str, schedule: str, d_model: int
) -> None:
    module = PositionalEncoding(
        d_model, layout=layout, schedule=schedule, max_len=16
    ).eval()
    x = torch.randn(40, 2, d_model)  # longer than max_len: the on-the-fly path too
    table = sinusoidal_encoding(40, d_model, layout=layout, schedule=schedule)
    assert torch.equal(module(x), x + table.unsqueeze(1))


def test_defaults_are_the_paper() -> None:
    p = torch.arange(0, 2**20, 4099)
    assert torch.equal(
        sinusoidal_encoding(p, 63),
        sinusoidal_encoding(p, 63, layout="interleaved", schedule="paper"),
    )
    assert torch.equal(
        offset_matrix(9, 63),
        offset_matrix(9, 63, layout="interleaved", schedule="paper"),
    )


@pytest.mark.parametrize("function", [sinusoidal_encoding, offset_matrix])
def test_unknown_conventions_are_refused_by_name(function: object) -> None:
    with pytest.raises(ValueError, match="layout"):
        function(4, 8, layout="split")  # type: ignore[operator]
    with pytest.raises(ValueError, match="schedule"):
        function(4, 8, schedule="fairseq")  # type: ignore[operator]


# ----- the installed Hugging Face code, run as it is ------------------------------------------------------------


@pytest.mark.peers
def test_the_installed_hugging_face_tables(set_default_dtype) -> None:
    """The chapter restates Marian's, Whisper's and M2M100's (fairseq's) tables; here the installed transformers
    (pinned in requirements.txt) computes them itself. Marian forms its table in float64 NumPy and rounds once to
    float32: posenc's float32 table equals it to one float32 ulp plus the float64 bound, and the restatement above
    equals it bitwise. Whisper's ``sinusoids`` under the float64 default dtype is posenc's float64 table to the
    float64 bound. M2M100's ``get_embedding`` names float32 (``.float()``), so it carries float32 angle errors,
    within the classic bound (2 ln(base) + 4) 2^-24 p + 2^-23 of the precision chapter and above the float64
    bound; its odd widths end with a zero channel and its row ``padding_idx`` is zero."""
    require("transformers")
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding,
    )
    from transformers.models.marian.modeling_marian import (
        MarianSinusoidalPositionalEmbedding,
    )
    from transformers.models.whisper.modeling_whisper import sinusoids

    n = 3000
    bound = peer_tolerance(n, 1e4)
    for d_model in (7, 64, 512):
        marian = MarianSinusoidalPositionalEmbedding(n, d_model).create_weight()
        assert marian.dtype == torch.float32
        ours = sinusoidal_encoding(n, d_model, layout="half")
        one_ulp = torch.finfo(torch.float32).eps * marian.abs().double()
        assert ((marian - ours).abs().double() <= one_ulp + bound).all()
        literal = torch.from_numpy(marian_create_weight_literal(n, d_model)).float()
        assert torch.equal(marian, literal)

    set_default_dtype(torch.float64)
    whisper = sinusoids(n, 64)
    assert whisper.dtype == torch.float64
    assert (whisper - posenc_half(range(n), 64, "tensor2tensor")).abs().max() <= bound

    set_default_dtype(torch.float32)
    classic = (2 * math.log(1e4) + 4) * 2.0**-24 * n + 2.0**-23
    for d_model in (7, 64):
        m2m = M2M100SinusoidalPositionalEmbedding.get_embedding(n, d_model, 1).double()
        reference = posenc_half(range(n), d_model, "tensor2tensor")
        reference[1] = 0  # padding_idx = 1
        error = (m2m - reference).abs().max().item()
        assert bound < error <= classic
        assert not m2m[:, 2 * (d_model // 2) :].any()  # the zero channel of odd widths
