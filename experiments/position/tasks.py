"""Synthetic tasks with exact answers: copy, reverse and sort.

Every example is one token sequence

    [BOS] x_1 ... x_n [SEP] y_1 ... y_n [EOS]

with the n input symbols x_i drawn uniformly (with repetition) from ``N_SYMBOLS`` symbols, and y the task's
answer: x itself (copy), x backwards (reverse) or x in increasing order (sort). A decoder reads it left to
right and predicts each next token; only the n + 1 answer tokens y_1 ... y_n, EOS count in the loss and in
the scores. Sort needs no positions to be answered (it depends on how often each symbol occurs, not on
where); copy and reverse do: the token to emit at answer step j sits n places back (copy) or at the mirror
position (reverse).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Special tokens; the symbols are ``FIRST_SYMBOL, ..., VOCAB_SIZE - 1``.
PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_SYMBOL = 4
N_SYMBOLS = 16
VOCAB_SIZE = FIRST_SYMBOL + N_SYMBOLS
TASKS = ("copy", "reverse", "sort")


def answer(task: str, x: Tensor) -> Tensor:
    """The answer y to input symbols x.

    Args:
        task: ``"copy"``, ``"reverse"`` or ``"sort"``.
        x: symbols, ``[batch, n]``.

    Returns:
        ``[batch, n]``, same dtype as ``x``.
    """
    if task == "copy":
        return x.clone()
    if task == "reverse":
        return x.flip(-1)
    if task == "sort":
        return x.sort(dim=-1).values
    raise ValueError(f"task must be one of {', '.join(map(repr, TASKS))}, got {task!r}")


def examples(task: str, n: int, batch: int, generator: torch.Generator) -> Tensor:
    """``batch`` examples of input length ``n``, as full token sequences.

    Args:
        task: one of ``TASKS``.
        n: input length, >= 1.
        batch: number of examples.
        generator: the source of randomness (seeded by the caller).

    Returns:
        int64 tokens ``[batch, 2n + 3]``: BOS, n symbols, SEP, n answer symbols, EOS.
    """
    x = torch.randint(FIRST_SYMBOL, VOCAB_SIZE, (batch, n), generator=generator)
    column = torch.full((batch, 1), 0, dtype=torch.long)
    return torch.cat(
        [column + BOS, x, column + SEP, answer(task, x), column + EOS], dim=1
    )


def padded_examples(task: str, lengths: Tensor, generator: torch.Generator) -> Tensor:
    """One example per entry of ``lengths``, right-padded with ``PAD`` to the longest.

    Padding goes at the end, after EOS: under a causal mask no real token attends to it.

    Args:
        task: one of ``TASKS``.
        lengths: the input length n of each row, int64 ``[batch]``, each >= 1.
        generator: the source of randomness.

    Returns:
        int64 tokens ``[batch, 2 max(lengths) + 3]``; row b holds ``2 lengths[b] + 3`` tokens, then padding.
    """
    width = 2 * int(lengths.max()) + 3
    tokens = torch.full((len(lengths), width), PAD, dtype=torch.long)
    for n in lengths.unique().tolist():
        rows = (lengths == n).nonzero().squeeze(1)
        tokens[rows, : 2 * n + 3] = examples(task, n, len(rows), generator)
    return tokens


def training_batch(
    task: str, max_len: int, batch: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A batch with input lengths drawn uniformly from 1..max_len, right-padded.

    The loss mask excludes the padding, so padding changes nothing for any positional scheme.

    Args:
        task: one of ``TASKS``.
        max_len: the longest input length L.
        batch: number of examples.
        generator: the source of randomness.

    Returns:
        ``(inputs, targets, loss_mask, lengths)``: ``inputs`` and ``targets`` int64 ``[batch, 2L + 2]``
        (the sequence without its last and without its first token), ``loss_mask`` bool ``[batch, 2L + 2]``,
        true where the target is an answer token or EOS, and ``lengths`` int64 ``[batch]``, the n of each row.
    """
    lengths = torch.randint(1, max_len + 1, (batch,), generator=generator)
    tokens = torch.full((batch, 2 * max_len + 3), PAD, dtype=torch.long)
    filled = padded_examples(task, lengths, generator)
    tokens[:, : filled.shape[1]] = filled
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    # target t is tokens[t + 1]: the answer y_1..y_n, EOS sit at tokens[n + 2 .. 2n + 2]
    t = torch.arange(tokens.shape[1] - 1)
    loss_mask = (t >= lengths[:, None] + 1) & (t <= 2 * lengths[:, None] + 1)
    return inputs, targets, loss_mask, lengths
