"""Training at the context L, fine-tuning at factor x L, and the loss at every position up to 8 L.

One run of the base stage (:func:`base_run`) trains a :class:`~experiments.context.model.ByteLM` at context
``L`` with plain RoPE for ``base_steps`` steps (AdamW, linear warm-up then cosine decay to a tenth), saves it,
and evaluates it *zero-shot* under every method: the same weights, each method's frequencies. One run of the
fine-tune stage (:func:`finetune_run`) loads a base model, sets one method's rotary embedding and trains
``finetune_steps`` steps at ``factor * L`` with as many bytes per step as the base stage, the same budget for
every method (plain RoPE too: the papers' "fine-tuned extrapolation"), then evaluates it.

The evaluation (:func:`evaluate`) is teacher-forced next-byte cross-entropy on ``eval_windows`` windows of the
held-out files at each length of ``eval_lengths`` (multiples of L), the same windows for every seed and method,
averaged over windows per position and reduced to buckets of ``bucket`` positions: the mean loss in nats per
byte of each bucket, and of the whole window. A fresh rotary module per length, so that dynamic NTK adapts to
that length and to no other.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from experiments.position.train import weights_digest

from . import data
from .model import METHODS, ByteLM, ModelConfig, rotary


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run."""

    context: int = 64
    factor: int = 4
    batch_size: int = 32
    base_steps: int = 1500
    base_lr: float = 3e-3
    warmup: int = 100
    finetune_steps: int = 100
    finetune_lr: float = 1e-3
    finetune_warmup: int = 10
    weight_decay: float = 0.01
    clip: float = 1.0
    eval_lengths: tuple[int, ...] = (1, 2, 4, 8)  # multiples of context
    eval_windows: int = 64
    bucket: int = 8
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "eval_lengths", tuple(self.eval_lengths))
        if (self.batch_size * self.context) % (self.factor * self.context):
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of factor={self.factor}: "
                "the fine-tune keeps the bytes per step"
            )
        if self.context % self.bucket:
            raise ValueError(f"bucket={self.bucket} must divide context={self.context}")

    @property
    def model(self) -> ModelConfig:
        return ModelConfig(self.d_model, self.n_heads, self.n_layers, self.d_ff)

    @property
    def longest(self) -> int:
        return max(self.eval_lengths) * self.context


def _schedule(step: int, steps: int, peak: float, warmup: int, floor: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def _train(
    model: ByteLM,
    text: torch.Tensor,
    steps: int,
    batch_size: int,
    length: int,
    peak: float,
    warmup: int,
    floor: float,
    config: RunConfig,
    generator: torch.Generator,
) -> list[float]:
    opt = torch.optim.AdamW(
        model.parameters(), lr=peak, weight_decay=config.weight_decay
    )
    losses = []
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _schedule(step, steps, peak, warmup, floor)
        window = data.batch(text, batch_size, length, generator)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        opt.step()
        losses.append(loss.item())
    return losses


def _curve(losses: list[float], every: int = 50) -> list[float]:
    """Mean training loss of each block of ``every`` steps, rounded to 5 decimals."""
    return [
        round(sum(losses[i : i + every]) / len(losses[i : i + every]), 5)
        for i in range(0, len(losses), every)
    ]


@torch.no_grad()
def evaluate(
    model: ByteLM, method: str, config: RunConfig, held_out: torch.Tensor
) -> dict[str, Any]:
    """The held-out loss of ``model`` under ``method`` at every length of ``config.eval_lengths``.

    Returns:
        per length (key: the multiple of L, as a string) ``{"loss": mean nats per byte over
        the window, "buckets": mean over each bucket of positions}``.
    """
    model.eval()
    out = {}
    for multiple in config.eval_lengths:
        n = multiple * config.context
        model.rope = rotary(config.model, method, config.context, config.factor, n)
        windows = data.windows(held_out, config.eval_windows, n)
        total = torch.zeros(n, dtype=torch.float64)
        for chunk in windows.split(16):
            with torch.no_grad():
                logits = model(chunk[:, :-1])
            loss = F.cross_entropy(
                logits.transpose(1, 2), chunk[:, 1:], reduction="none"
            )  # [windows, n]
            total += loss.double().sum(0)
        per_position = total / windows.shape[0]
        buckets = per_position.view(-1, config.bucket).mean(1)
        out[str(multiple)] = {
            "loss": round(per_position.mean().item(), 6),
            "buckets": [round(v, 5) for v in buckets.tolist()],
        }
    return out


def base_run(seed: int, config: RunConfig, save: Path | None = None) -> dict[str, Any]:
    """Train the base model of ``seed`` at L and evaluate it zero-shot under every method.

    Returns:
        the record: settings, the training curve, the weights' SHA-256 and ``zero_shot``
        (per method, :func:`evaluate`'s result), with the timings.
    """
    cpu_start, start = time.process_time(), time.perf_counter()
    corpus = data.load()
    torch.manual_seed(seed)
    model = ByteLM(
        config.model, rotary(config.model, "none", config.context, 1, config.context)
    )
    generator = torch.Generator().manual_seed(seed)
    losses = _train(
        model, corpus.train, config.base_steps, config.batch_size, config.context,
        config.base_lr, config.warmup, 0.1, config, generator,
    )  # fmt: skip
    train_seconds = time.perf_counter() - start
    digest = weights_digest(model)
    if save is not None:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, save)
    zero_shot = {m: evaluate(model, m, config, corpus.held_out) for m in METHODS}
    return {
        "stage": "base",
        "seed": seed,
        "method": None,
        "data_sha256": corpus.sha256,
        "steps": len(losses),
        "curve": _curve(losses),
        "weights_sha256": digest,
        "results": zero_shot,
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def finetune_run(
    seed: int, method: str, config: RunConfig, base: Path, base_sha256: str
) -> dict[str, Any]:
    """Fine-tune the base model of ``seed`` (saved at ``base``, whose weights must have the
    SHA-256 ``base_sha256``) at ``factor * L`` under ``method``, then evaluate it.

    The fine-tune's windows come from a generator seeded by ``seed`` alone: every method of a
    seed is fine-tuned on the same bytes in the same order.
    """
    cpu_start, start = time.process_time(), time.perf_counter()
    corpus = data.load()
    length = config.factor * config.context
    model = ByteLM(
        config.model,
        rotary(config.model, method, config.context, config.factor, length),
    )
    model.load_state_dict(torch.load(base, weights_only=True))
    if weights_digest(model) != base_sha256:
        raise RuntimeError(
            f"{base} holds weights of SHA-256 {weights_digest(model)}, not the base run's "
            f"{base_sha256}: rerun the base stage of seed {seed}"
        )
    generator = torch.Generator().manual_seed(1000 * (seed + 1))
    losses = _train(
        model, corpus.train, config.finetune_steps, config.batch_size // config.factor,
        length, config.finetune_lr, config.finetune_warmup, 0.0, config, generator,
    )  # fmt: skip
    train_seconds = time.perf_counter() - start
    result = evaluate(model, method, config, corpus.held_out)
    return {
        "stage": "finetune",
        "seed": seed,
        "method": method,
        "data_sha256": corpus.sha256,
        "steps": len(losses),
        "curve": _curve(losses, 10),
        "base_weights_sha256": base_sha256,
        "weights_sha256": weights_digest(model),
        "results": result,
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def settings(config: RunConfig) -> dict[str, Any]:
    """The config as the results file records it."""
    return {**asdict(config), "eval_lengths": list(config.eval_lengths)}


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
