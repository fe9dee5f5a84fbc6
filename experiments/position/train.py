"""Train one tiny decoder on one task, then measure it at every input length by greedy decoding.

Training: AdamW, linear warm-up then cosine decay to a tenth of the peak rate, gradient norm clipped to 1,
input lengths uniform on 1..L, fresh random examples at every step (no fixed training set, so nothing to
memorise), loss on the answer tokens and EOS only.

Evaluation: for each input length n = 1..``eval_max_len``, ``eval_samples`` fresh examples (the same examples
for every scheme of a seed). The model sees ``[BOS] x [SEP]`` and generates n + 1 tokens greedily, feeding back
its own argmax (with a KV cache). Exact match: all n answer symbols and the EOS right. Token accuracy: the
fraction of those n + 1 tokens right, position by position.

Determinism: everything random comes from generators seeded by the run's seed, and each run uses one thread,
so the same seed gives the same numbers on the same machine, whatever the number of parallel workers.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
class TrainConfig:
    """Everything about a run except the scheme, task and seed."""

    train_max_len: int = 20  # L: input lengths 1..L at training
    eval_max_len: int = 60  # evaluated at n = 1..3L
    steps: int = 1200
    batch_size: int = 32
    lr: float = 6e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eval_samples: int = 32
    eval_group: int = 15  # lengths decoded together (left-padded to the longest)
    # each training batch is cut into this many groups of similar length
    buckets: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    random_range: int = 256  # sinusoidal_random: positions from [0, random_range)

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


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr / 10`` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: TinyDecoder,
    task: str,
    config: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
) -> list[float]:
    """Train ``model`` in place on ``task``; returns the loss of every step.

    Each batch is sorted by length and cut into ``config.buckets`` groups, each
    trimmed to its own longest sequence (the right padding of the short ones is never
    computed); the loss is the mean over every answer token of the batch, as if it
    were one tensor.
    """
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(0.9, 0.98),
        weight_decay=config.weight_decay,
    )
    randomized = model.config.scheme == "sinusoidal_random"
    losses = []
    for step in range(config.steps):
        inputs, targets, mask, lengths = tasks.training_batch(
            task, config.train_max_len, config.batch_size, generator
        )
        positions = None
        if randomized:
            positions = random_positions(
                2 * lengths + 2, inputs.shape[1], config.random_range, generator
            )
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
    return losses


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


def _eval_positions(
    model: TinyDecoder, n: int, samples: int, width: int, generator: torch.Generator
) -> Tensor:
    """Positions of the ``width`` tokens fed in for input length ``n``: ``[samples, width]``.

    The 2n + 2 tokens that matter (prompt and answer) get 0, 1, 2, ... or, for the randomized scheme, a
    sorted random subset of ``[0, random_range)`` as in training; tokens generated after EOS (ignored) get
    the positions that follow.
    """
    needed = 2 * n + 2
    if model.config.scheme == "sinusoidal_random":
        head = random_positions(
            torch.full((samples,), needed), needed, model.config.random_range, generator
        )
        tail = model.config.random_range + torch.arange(width - needed)
        return torch.cat([head, tail.expand(samples, -1)], dim=1)
    return torch.arange(width).expand(samples, -1)


def evaluate(
    model: TinyDecoder,
    task: str,
    config: TrainConfig,
    seed: int,
    device: torch.device,
    lengths: list[int] | None = None,
) -> dict[str, list[Any]]:
    """Exact match and token accuracy at each input length, by greedy decoding.

    The examples come from a generator seeded with ``seed`` alone, so every scheme of a seed is measured on
    the same inputs. Lengths are decoded in groups of ``config.eval_group`` lengths, the shorter prompts
    left-padded (masked, with positions starting at 0 at BOS, so each row computes what it would alone).
    A length whose sequence does not fit the learned table is recorded as ``None`` (not defined), not as 0.

    Returns:
        ``{"lengths": [...], "exact_match": [...], "token_accuracy": [...]}``, floats or ``None``.
    """
    lengths = lengths or list(range(1, config.eval_max_len + 1))
    generator = torch.Generator().manual_seed(10_000 + seed)
    data = {n: tasks.examples(task, n, config.eval_samples, generator) for n in lengths}
    position_generator = torch.Generator().manual_seed(20_000 + seed)
    scores: dict[int, tuple[float | None, float | None]] = {}
    defined = [n for n in lengths if model.defines(2 * n + 2)]
    for n in lengths:
        if n not in defined:
            scores[n] = (None, None)
    for start in range(0, len(defined), config.eval_group):
        group = defined[start : start + config.eval_group]
        top = max(group)
        w, n_new = top + 2, top + 1
        prompts, valid, positions = [], [], []
        for n in group:
            pad = w - (n + 2)
            prompt = data[n][:, : n + 2]
            prompts.append(torch.nn.functional.pad(prompt, (pad, 0), value=tasks.PAD))
            valid.append(torch.arange(w).expand(len(prompt), -1) >= pad)
            pos = _eval_positions(
                model, n, len(prompt), n + 2 + n_new - 1, position_generator
            )
            positions.append(torch.nn.functional.pad(pos, (pad, 0), value=0))
        predicted = greedy_answers(
            model,
            torch.cat(prompts).to(device),
            torch.cat(valid).to(device),
            torch.cat(positions).to(device),
            n_new,
        ).cpu()
        for k, n in enumerate(group):
            rows = predicted[
                k * config.eval_samples : (k + 1) * config.eval_samples, : n + 1
            ]
            right = rows == data[n][:, n + 2 :]  # [samples, n + 1]: y_1..y_n, EOS
            scores[n] = (
                round(right.all(dim=1).float().mean().item(), 6),
                round(right.float().mean().item(), 6),
            )
    return {
        "lengths": list(lengths),
        "exact_match": [scores[n][0] for n in lengths],
        "token_accuracy": [scores[n][1] for n in lengths],
    }


def run(
    scheme: str,
    task: str,
    seed: int,
    config: TrainConfig,
    device: str = "cpu",
    save_state: Path | None = None,
) -> dict[str, Any]:
    """Build, train and evaluate one model; the record that goes into the results file.

    Args:
        scheme: one of ``model.SCHEMES``.
        task: one of ``tasks.TASKS``.
        seed: seeds the initialisation, the training data and the evaluation data.
        config: the training settings.
        device: ``"cpu"`` or ``"cuda"``.
        save_state: if given, the trained ``state_dict`` is saved there (``torch.save``).

    Returns:
        ``{"scheme", "task", "seed", "train_seconds", "eval_seconds", "cpu_seconds", "final_loss",
        "lengths", "exact_match", "token_accuracy"}``; ``cpu_seconds`` is the processor time of the run
        (with one thread, what it would take alone on a free core).
    """
    dev = torch.device(device)
    cpu_start = time.process_time()
    torch.manual_seed(seed)
    model = TinyDecoder(config.model_config(scheme)).to(dev)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    losses = train(model, task, config, generator, dev)
    train_seconds = time.perf_counter() - start
    result = evaluate(model, task, config, seed, dev)
    if save_state is not None:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, save_state)
    tail = losses[-50:]
    return {
        "scheme": scheme,
        "task": task,
        "seed": seed,
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "final_loss": round(sum(tail) / len(tail), 5),
        **result,
    }


def settings(config: TrainConfig) -> dict[str, Any]:
    """The settings as a plain dict, for the results file."""
    return asdict(config)
