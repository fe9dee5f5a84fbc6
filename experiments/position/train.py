"""Train one tiny decoder on one task, then measure it at every input length.

Training: AdamW, a linear warm-up then a cosine decay to a tenth of the peak rate at the step cap (the schedule
does not depend on when the run stops), gradient norm clipped to 1, input lengths uniform on 1..L, fresh random examples
at every step (no fixed training set, so nothing to memorise), loss on the answer tokens and EOS only.

Convergence, by a rule recorded in the results file: every ``validate_every`` steps the exact match on a fixed
validation set (lengths 1..L) is recorded (the learning curve). From ``min_steps`` on, a run stops at the first
validation step s where the mean exact match over its last ``plateau_window`` (20 %) of steps, (0.8 s, s],
exceeds the mean over the 20 % before them, (0.6 s, 0.8 s], by less than ``plateau_gain`` (1 point), or is
itself within that 1 point of 100 % (no room left to gain it): the run is *converged* (``converged``: true).
A run that reaches ``max_steps`` without meeting the rule stops there, not converged (unless the rule holds at
that very step). Converged means "stopped improving on the training lengths", not "solved": a run can converge
far below 100 %.

Evaluation, for each input length n = 1..``eval_max_len``, on ``eval_samples`` fresh examples (the same examples
for every scheme of a seed), by one teacher-forced forward pass: the model reads
``[BOS] x [SEP] y_1 ... y_n`` and its argmax at each answer position is compared with y_1 ... y_n, EOS.

- **Exact match**: every one of the n + 1 argmaxes right. This is exactly the exact match of greedy decoding
  (the model generating its answer from its own outputs): up to its first error a greedy answer *is* the
  teacher-forced argmax, so the two agree on every example, and on where and how the first error happens.
  Each run re-checks this by decoding greedily at a few lengths (``greedy_check``).
- **Token accuracy**: the fraction of the n + 1 answer tokens whose argmax is right, each predicted from the true
  tokens before it: a per-token measure that does not let one error derail the rest.
- **First token**: whether y_1 is right (the same under greedy decoding).
- **First error**: for an example that is not exactly right, the kind of its first wrong token: an EOS before
  y_n (``early_eos``), a symbol where EOS was due (``no_eos``: the model does not stop), or a wrong symbol
  (``wrong_symbol``). With exact match these four counts add up to ``eval_samples`` at every length.
- **Probe** (copy and reverse): the head that puts the most attention on the *source* of each answer token (the
  input symbol it must reproduce) over lengths 1..L; at every length, its mean weight on the sources and the
  offset (query index minus key index) of its strongest key for the first answer token.

Determinism: everything random comes from generators seeded by the run's seed, and each run uses one thread,
so the same seed gives the same numbers on the same machine, whatever the number of parallel workers.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from . import tasks
from .model import (
    KVCache,
    ModelConfig,
    TinyDecoder,
    random_positions,
)

#: The kinds of first error, in the order they are recorded.
ERRORS = ("early_eos", "no_eos", "wrong_symbol")


@dataclass(frozen=True)
class TrainConfig:
    """Everything about a run except the scheme, task and seed (and, per pair, ``lr``)."""

    train_max_len: int = 12  # L: input lengths 1..L at training
    eval_max_len: int = 36  # evaluated at n = 1..3L
    max_steps: int = 3200  # the cap: a run stops here if the rule has not stopped it
    min_steps: int = 2000  # the rule is not applied before this step
    plateau_window: float = 0.2  # the rule compares the last 20 % of the steps ...
    plateau_gain: float = 0.01  # ... with the 20 % before: stop below 1 point
    batch_size: int = 32
    lr: float = 3e-3  # the peak rate (each pair's is chosen on validation)
    warmup: int = 100
    weight_decay: float = 0.01
    eval_samples: int = 128  # fresh examples per evaluated length
    validate_every: int = 100  # steps between points of the learning curve
    validation_per_length: int = 48  # validation examples per length 1..L
    # each training batch is cut into this many groups of similar length
    buckets: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    random_range: int = 256  # sinusoidal_random: positions from [0, random_range)

    def __post_init__(self) -> None:
        for name in ("train_max_len", "eval_max_len", "max_steps", "validate_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(
                    f"{name} must be a positive int, got {getattr(self, name)!r}"
                )
        if not 0 <= self.min_steps <= self.max_steps:
            raise ValueError(
                f"min_steps must be in 0..max_steps={self.max_steps}, got "
                f"{self.min_steps}; lower min_steps or raise max_steps"
            )
        if self.max_steps % self.validate_every or self.min_steps % self.validate_every:
            raise ValueError(
                f"max_steps={self.max_steps} and min_steps={self.min_steps} must be "
                f"multiples of validate_every={self.validate_every}, so that the rule "
                "is checked at the cap"
            )
        if not 0 < self.plateau_window <= 0.5:
            raise ValueError(
                f"plateau_window must be in (0, 0.5], got {self.plateau_window}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def model_config(self, scheme: str) -> ModelConfig:
        """The architecture for ``scheme``; the learned table covers the longest training sequence."""
        return ModelConfig(
            scheme=scheme,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
            d_ff=self.d_ff,
            max_positions=2 * self.train_max_len + 2,
            random_range=self.random_range,
        )

    def greedy_check_lengths(self) -> list[int]:
        """The lengths at which each run decodes greedily to re-check the teacher-forced scores:
        L/2 and L inside, L + 1, 2L and 3L beyond (where the scheme is defined)."""
        L, top = self.train_max_len, self.eval_max_len
        wanted = (max(1, L // 2), L, L + 1, 2 * L, 3 * L)
        return sorted({n for n in wanted if 1 <= n <= top})


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``lr / 10`` at the cap.

    The schedule runs over ``max_steps`` whether or not the convergence rule stops the run
    earlier, so stopping changes nothing about the steps before it."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.max_steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def plateaued(curve: dict[str, list[Any]], config: TrainConfig) -> bool:
    """The convergence rule on a learning curve that ends at step s: s >= ``min_steps`` and the
    mean exact match at the steps in ((1 - w) s, s] exceeds the mean at the steps in
    ((1 - 2w) s, (1 - w) s] by less than ``plateau_gain`` (w = ``plateau_window``).

    A run whose recent mean is already within ``plateau_gain`` of 1 (perfect) has stopped
    improving by definition: it cannot gain another ``plateau_gain``.

    Means over the points of each window, not single points or maxima: one validation
    point is noisy (a few examples of the fixed set), and comparing maxima of windows of
    different sizes is biased towards stopping."""
    steps, exact = curve["steps"], curve["exact"]
    if not steps or steps[-1] < config.min_steps:
        return False
    s, w = steps[-1], config.plateau_window
    recent = [e for t, e in zip(steps, exact) if (1 - w) * s < t]
    before = [e for t, e in zip(steps, exact) if (1 - 2 * w) * s < t <= (1 - w) * s]
    if not recent or not before:
        return False
    mean = sum(recent) / len(recent)
    if mean >= 1 - config.plateau_gain:
        return True  # within one gain of perfect: no room left to improve by a gain
    return mean - sum(before) / len(before) < config.plateau_gain


def sequence_positions(
    model: TinyDecoder,
    lengths: Tensor,
    width: int,
    generator: torch.Generator,
) -> Tensor | None:
    """Positions of right-padded sequences of ``2 lengths + 2`` real tokens, ``[batch, width]``.

    None (the default 0, 1, 2, ...) for every scheme but ``sinusoidal_random``, whose positions are a sorted
    random subset of ``[0, random_range)`` drawn afresh for every sequence, as in training.
    """
    if model.config.scheme != "sinusoidal_random":
        return None
    return random_positions(
        2 * lengths + 2, width, model.config.random_range, generator
    )


def train(
    model: TinyDecoder,
    task: str,
    config: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    validation: tuple[Tensor, Tensor, Tensor | None] | None = None,
    steps: int | None = None,
) -> tuple[list[float], dict[str, list[Any]], bool]:
    """Train ``model`` in place on ``task`` until the convergence rule stops it, or the cap.

    Each batch is sorted by length and cut into ``config.buckets`` groups, each
    trimmed to its own longest sequence (the right padding of the short ones is never
    computed); the loss is the mean over every answer token of the batch, as if it
    were one tensor.

    Args:
        model: the decoder, trained in place.
        task: one of ``tasks.TASKS``.
        config: the settings.
        generator: the source of the training data (and randomized positions).
        device: where the model lives.
        validation: ``(tokens, lengths, positions)`` of a fixed validation set (see
            :func:`validation_set`); its exact match is recorded every
            ``config.validate_every`` steps, and the convergence rule
            (:func:`plateaued`) is applied to it. None: no curve, no rule.
        steps: train exactly this many steps, without the rule (tests); default:
            the rule, up to ``config.max_steps``.

    Returns:
        ``(losses, curve, converged)``: the loss of every step,
        ``{"steps": [...], "exact": [...]}`` (the learning curve; empty lists
        without ``validation``), and whether the rule stopped the run.
    """
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(0.9, 0.98),
        weight_decay=config.weight_decay,
        fused=device.type == "cpu" or None,
    )
    losses: list[float] = []
    curve: dict[str, list[Any]] = {"steps": [], "exact": []}
    cap = config.max_steps if steps is None else steps
    for step in range(cap):
        inputs, targets, mask, lengths = tasks.training_batch(
            task, config.train_max_len, config.batch_size, generator
        )
        positions = sequence_positions(model, lengths, inputs.shape[1], generator)
        total = mask.sum()
        loss = torch.zeros((), device=device)
        for rows in lengths.argsort().chunk(config.buckets):
            # tokens fed in for the longest row
            width = 2 * int(lengths[rows].max()) + 2
            pos = None if positions is None else positions[rows, :width].to(device)
            logits = model(inputs[rows, :width].to(device), pos)
            m = mask[rows, :width].to(device)
            loss = loss + F.cross_entropy(
                logits[m], targets[rows, :width].to(device)[m], reduction="sum"
            )
        loss = loss / total
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        done = step + 1
        if validation is not None and (
            done % config.validate_every == 0 or done == cap
        ):
            curve["steps"].append(done)
            curve["exact"].append(validation_exact(model, validation, device))
            model.train()
            if steps is None and plateaued(curve, config):
                return losses, curve, True
    return losses, curve, False


@torch.no_grad()
def answer_argmax(
    model: TinyDecoder,
    tokens: Tensor,
    lengths: Tensor,
    positions: Tensor | None,
    device: torch.device,
    return_attention: bool = False,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor] | None]:
    """The teacher-forced argmax at every answer position.

    Args:
        model: the decoder.
        tokens: int64 ``[batch, w]``: right-padded examples
            ``[BOS] x [SEP] y [EOS]``, ``w >= 2 max(lengths) + 3``.
        lengths: the input length n of each row, int64 ``[batch]``.
        positions: int64 ``[batch, w - 1]`` or None (0, 1, 2, ...).
        device: where the model lives.
        return_attention: also return each layer's attention weights.

    Returns:
        ``(predicted, target, valid, maps)``: ``predicted`` and ``target`` int64
        ``[batch, max(lengths) + 1]``, the argmax and the true token for y_1 ... y_n,
        EOS of each row (left-aligned); ``valid`` bool, the same shape, False past a
        row's n + 1 answer tokens; ``maps`` each layer's attention weights
        ``[batch, heads, w - 1, w - 1]`` (on the CPU), or None.
    """
    model.eval()
    inputs = tokens[:, :-1].to(device)
    pos = None if positions is None else positions.to(device)
    if return_attention:
        logits, maps = model(inputs, pos, return_attention=True)
        maps = [m.cpu() for m in maps]
    else:
        logits, maps = model(inputs, pos), None
    j = torch.arange(int(lengths.max()) + 1)
    # the answer token y_j (j = 1..n) and EOS are predicted at input index n + j
    index = lengths[:, None] + 1 + j
    predicted = logits.argmax(-1).cpu().gather(1, index)
    target = tokens.gather(1, index + 1)
    valid = j <= lengths[:, None]
    return predicted, target, valid, maps


def score_rows(
    predicted: Tensor, target: Tensor, valid: Tensor, lengths: Tensor
) -> dict[str, Tensor]:
    """Per row: exact, number of right tokens, first token right, kind of first error.

    Args:
        predicted, target, valid: as returned by :func:`answer_argmax`,
            ``[batch, max(lengths) + 1]``.
        lengths: int64 ``[batch]``.

    Returns:
        bool ``[batch]`` tensors ``"exact"``, ``"first"``, ``"early_eos"``, ``"no_eos"``,
        ``"wrong_symbol"`` (exactly one of exact and the three errors is true in each
        row) and int64 ``[batch]`` ``"tokens"`` and ``"error_at"`` (the answer index
        1..n + 1 of the first wrong token; meaningless where exact).
    """
    hit = predicted == target
    right = hit | ~valid
    exact = right.all(dim=1)
    first_wrong = (~right).to(torch.uint8).argmax(dim=1)  # 0 where exact
    said = predicted.gather(1, first_wrong[:, None]).squeeze(1)
    at_end = first_wrong == lengths  # the EOS position
    return {
        "exact": exact,
        "tokens": (hit & valid).sum(dim=1),
        "first": hit[:, 0],
        "early_eos": ~exact & ~at_end & (said == tasks.EOS),
        "no_eos": ~exact & at_end,
        "wrong_symbol": ~exact & ~at_end & (said != tasks.EOS),
        "error_at": first_wrong + 1,
    }


def validation_set(
    model: TinyDecoder, task: str, config: TrainConfig, seed: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``validation_per_length`` examples of every length 1..L, right-padded, with their positions;
    seeded by ``seed`` alone (the same inputs for every scheme of a seed)."""
    generator = torch.Generator().manual_seed(30_000 + seed)
    lengths = torch.arange(1, config.train_max_len + 1).repeat_interleave(
        config.validation_per_length
    )
    tokens = tasks.padded_examples(task, lengths, generator)
    positions = sequence_positions(model, lengths, tokens.shape[1] - 1, generator)
    return tokens, lengths, positions


def validation_exact(
    model: TinyDecoder,
    validation: tuple[Tensor, Tensor, Tensor | None],
    device: torch.device,
) -> float:
    """Exact match on the validation set (teacher-forced, hence also greedy's)."""
    tokens, lengths, positions = validation
    scores = score_rows(
        *answer_argmax(model, tokens, lengths, positions, device)[:3], lengths
    )
    return round(scores["exact"].float().mean().item(), 4)


def _sources(task: str, n: int) -> Tensor:
    """Input index of the source of y_1..y_n: copy x_j at j, reverse x_{n+1-j} at n + 1 - j."""
    j = torch.arange(1, n + 1)
    return j if task == "copy" else n + 1 - j


def _head_statistics(maps: list[Tensor], task: str, n: int) -> tuple[Tensor, Tensor]:
    """``(source_weight, first_offset)``, each ``[layers, heads]``: the mean weight the queries
    predicting y_1..y_n put on their sources, and the mean offset (query index minus key index) of the
    strongest key of the query predicting y_1 (index n + 1, which holds SEP)."""
    queries = n + torch.arange(1, n + 1)
    sources = _sources(task, n)
    stacked = torch.stack(maps, dim=1)  # [batch, layers, heads, t, t]
    weight = stacked[:, :, :, queries, sources].mean(dim=(0, 3))
    strongest = stacked[:, :, :, n + 1, : n + 2].argmax(dim=-1)
    offset = (n + 1 - strongest).double().mean(dim=0)
    return weight, offset


def evaluate(
    model: TinyDecoder,
    task: str,
    config: TrainConfig,
    seed: int,
    device: torch.device,
    lengths: list[int] | None = None,
) -> dict[str, Any]:
    """Teacher-forced scores at each input length (see the module docstring), as counts.

    The examples come from a generator seeded with ``seed`` alone, so every scheme of a
    seed is measured on the same inputs. A length whose sequence does not fit the learned
    table is recorded as ``None`` (not defined), not as 0.

    Returns:
        ``{"lengths", "examples", "exact", "tokens", "first", "early_eos", "no_eos",
        "wrong_symbol", "error_at", "probe", "greedy_check"}``: per length, the number of
        examples exactly right, of answer tokens right (out of ``examples * (n + 1)``),
        of first tokens right and of each kind of first error (ints or ``None``);
        ``error_at`` is ``{"early_eos": [...], "wrong_symbol": [...]}``, per length the
        mean answer index (1..n) of those first errors (None where there are none);
        ``probe`` is
        ``{"layer", "head", "source_weight", "first_offset"}`` (copy and reverse; None
        for sort); ``greedy_check`` is ``{"lengths", "disagreements"}``: the lengths of
        :meth:`TrainConfig.greedy_check_lengths` at which the scheme is defined, and at
        each the number of examples whose greedy answer's exactness or first error
        differs from the teacher-forced one (0 unless two logits tie to the last bit).
    """
    lengths = lengths or list(range(1, config.eval_max_len + 1))
    samples = config.eval_samples
    generator = torch.Generator().manual_seed(10_000 + seed)
    data = {n: tasks.examples(task, n, samples, generator) for n in lengths}
    position_generator = torch.Generator().manual_seed(20_000 + seed)
    keys = ("exact", "tokens", "first", *ERRORS)
    counts: dict[str, list[int | None]] = {k: [] for k in keys}
    error_at: dict[str, list[float | None]] = {"early_eos": [], "wrong_symbol": []}
    probe_weight, probe_offset = {}, {}
    greedy: dict[str, list[int]] = {"lengths": [], "disagreements": []}
    probing = task in ("copy", "reverse")
    for n in lengths:
        if not model.defines(2 * n + 2):
            for k in keys:
                counts[k].append(None)
            for k in error_at:
                error_at[k].append(None)
            continue
        rows = torch.full((samples,), n)
        positions = sequence_positions(model, rows, 2 * n + 2, position_generator)
        predicted, target, valid, maps = answer_argmax(
            model, data[n], rows, positions, device, return_attention=probing
        )
        scores = score_rows(predicted, target, valid, rows)
        for k in keys:
            counts[k].append(int(scores[k].sum()))
        for k in error_at:
            where = scores["error_at"][scores[k]]
            error_at[k].append(
                round(where.double().mean().item(), 2) if len(where) else None
            )
        if probing:
            probe_weight[n], probe_offset[n] = _head_statistics(maps, task, n)
        if n in config.greedy_check_lengths():
            greedy["lengths"].append(n)
            greedy["disagreements"].append(
                _greedy_disagreements(model, data[n], positions, scores, device)
            )
    probe = None
    inside = [n for n in probe_weight if n <= config.train_max_len]
    if probing and inside:
        mean_weight = torch.stack([probe_weight[n] for n in inside]).mean(dim=0)
        layer, head = divmod(int(mean_weight.argmax()), mean_weight.shape[1])
        probe = {
            "layer": layer,
            "head": head,
            "source_weight": [
                round(float(probe_weight[n][layer, head]), 4)
                if n in probe_weight
                else None
                for n in lengths
            ],
            "first_offset": [
                round(float(probe_offset[n][layer, head]), 3)
                if n in probe_offset
                else None
                for n in lengths
            ],
        }
    return {
        "lengths": list(lengths),
        "examples": samples,
        **counts,
        "error_at": error_at,
        "probe": probe,
        "greedy_check": greedy,
    }


def _greedy_disagreements(
    model: TinyDecoder,
    seqs: Tensor,
    positions: Tensor | None,
    scores: dict[str, Tensor],
    device: torch.device,
) -> int:
    """Decode ``seqs``' prompts greedily; count the rows whose exactness or kind of first
    error differs from the teacher-forced ``scores``."""
    batch, n = seqs.shape[0], (seqs.shape[1] - 3) // 2
    if positions is None:
        positions = torch.arange(2 * n + 2).expand(batch, -1)
    generated = greedy_answers(
        model,
        seqs[:, : n + 2].to(device),
        torch.ones(batch, n + 2, dtype=torch.bool, device=device),
        positions.to(device),
        n + 1,
    ).cpu()
    rows = torch.full((batch,), n)
    target = seqs[:, n + 2 :]
    again = score_rows(
        generated, target, torch.ones_like(target, dtype=torch.bool), rows
    )
    differ = torch.zeros(batch, dtype=torch.bool)
    for k in ("exact", *ERRORS):
        differ |= again[k] != scores[k]
    return int(differ.sum())


@torch.no_grad()
def greedy_answers(
    model: TinyDecoder, prompts: Tensor, valid: Tensor, positions: Tensor, n_new: int
) -> Tensor:
    """Generate ``n_new`` tokens after each (left-padded) prompt, each the argmax
    given the ones before.

    Args:
        model: the decoder.
        prompts: int64 ``[batch, w]``, each row ``[PAD ...] [BOS] x [SEP]``, padded on
            the left.
        valid: bool ``[batch, w]``, False on the padding.
        positions: int64 ``[batch, w + n_new - 1]``, the position of every token fed
            in.
        n_new: number of tokens to generate.

    Returns:
        int64 ``[batch, n_new]``.
    """
    model.eval()
    w = prompts.shape[1]
    cache = KVCache(capacity=w + n_new - 1)
    logits = model(prompts, positions[:, :w], cache, valid)
    out = [logits[:, -1].argmax(-1)]
    for step in range(1, n_new):
        logits = model(out[-1][:, None], positions[:, w + step - 1 : w + step], cache)
        out.append(logits[:, -1].argmax(-1))
    return torch.stack(out, dim=1)


def steps_to_target(curve: dict[str, list[Any]], target: float) -> int | None:
    """The first recorded step at which the validation exact match reached ``target`` (None: never)."""
    for step, exact in zip(curve["steps"], curve["exact"]):
        if exact >= target:
            return step
    return None


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's ``state_dict``: every entry's name, dtype, shape and bytes, in key order.

    Two models have the same digest exactly when their weights are equal bit for bit (up to
    SHA-256 collisions)."""
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def run(
    scheme: str,
    task: str,
    seed: int,
    config: TrainConfig,
    device: str = "cpu",
    save_state: Path | None = None,
    evaluation: bool = True,
    steps: int | None = None,
) -> dict[str, Any]:
    """Build, train and evaluate one model; the record that goes into the results file.

    Args:
        scheme: one of ``model.SCHEMES``.
        task: one of ``tasks.TASKS``.
        seed: seeds the initialisation, the training data and the evaluation data.
        config: the training settings (``config.lr`` is the run's peak rate).
        device: ``"cpu"`` or ``"cuda"``.
        save_state: if given, the trained ``state_dict`` is saved there (``torch.save``).
        evaluation: evaluate at every length (False: the learning curve only, as the
            learning-rate selection needs).
        steps: train exactly this many steps, without the convergence rule (tests).

    Returns:
        ``{"scheme", "task", "seed", "lr", "steps", "converged", "train_seconds",
        "eval_seconds", "cpu_seconds", "final_loss", "curve", "weights_sha256",
        "cpu_capability", **evaluate(...)}``: ``steps`` is the number of steps trained,
        ``converged`` whether the rule stopped the run before the cap;
        ``cpu_seconds`` is the processor time of the run (with one thread, what it
        would take alone on a free core); ``cpu_capability`` the kernels torch used
        (``torch.backends.cpu.get_cpu_capability()``).
    """
    dev = torch.device(device)
    cpu_start = time.process_time()
    torch.manual_seed(seed)
    model = TinyDecoder(config.model_config(scheme)).to(dev)
    generator = torch.Generator().manual_seed(seed)
    validation = validation_set(model, task, config, seed)
    start = time.perf_counter()
    losses, curve, converged = train(
        model, task, config, generator, dev, validation, steps
    )
    train_seconds = time.perf_counter() - start
    result = evaluate(model, task, config, seed, dev) if evaluation else {}
    if save_state is not None:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, save_state)
    tail = losses[-50:]
    return {
        "scheme": scheme,
        "task": task,
        "seed": seed,
        "lr": config.lr,
        "steps": len(losses),
        "converged": converged,
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "final_loss": round(sum(tail) / len(tail), 5),
        "curve": curve,
        "weights_sha256": weights_digest(model),
        **result,
    }
