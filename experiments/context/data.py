"""The text: the Python source of mpmath, a package pinned in ``requirements.txt`` that nobody here wrote.

Every ``.py`` file of the installed ``mpmath`` package (its tests included), in the order of their paths
relative to the package, is read as bytes; the corpus is the files joined by one newline. Its identity is the
package's name and version and the SHA-256 of that joined text (:func:`identity`), which the results file
records and the tests check. The held-out split is by file: every ``HELD_OUT_EVERY``-th file in path order
(starting with the first) is held out, the others are trained on, so that no held-out byte shares a file with
a trained one. The vocabulary is the 256 byte values.

mpmath is BSD-licensed (3-clause, "Copyright (c) 2005-2021 Fredrik Johansson and mpmath contributors"); the
text is read from the environment, not copied into this repository.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor

PACKAGE = "mpmath"
#: The version ``requirements.txt`` pins; another installed version is refused.
VERSION = "1.3.0"
#: Every HELD_OUT_EVERY-th file (path order, from the first) is held out.
HELD_OUT_EVERY = 8
VOCAB_SIZE = 256


@dataclass(frozen=True)
class Corpus:
    """The two splits as byte tensors (``[n_bytes]``, int64) and the files of each."""

    train: Tensor
    held_out: Tensor
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]
    sha256: str
    n_bytes: int


def _files() -> tuple[Path, list[str]]:
    version = metadata.version(PACKAGE)
    if version != VERSION:
        raise RuntimeError(
            f"{PACKAGE} {version} is installed; the corpus is {PACKAGE}=={VERSION} "
            "(requirements.txt): make venv installs it"
        )
    import mpmath

    root = Path(mpmath.__file__).resolve().parent
    names = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts
    )
    return root, names


def load() -> Corpus:
    """Read the corpus and split it by file.

    Returns:
        a :class:`Corpus`; ``sha256`` is that of all files joined by ``b"\\n"``.
    """
    root, names = _files()
    texts = [(root / name).read_bytes() for name in names]
    joined = b"\n".join(texts)
    held = [i % HELD_OUT_EVERY == 0 for i in range(len(names))]

    def split(keep: bool) -> Tensor:
        part = b"\n".join(t for t, h in zip(texts, held) if h == keep)
        return torch.frombuffer(bytearray(part), dtype=torch.uint8).long()

    return Corpus(
        train=split(False),
        held_out=split(True),
        train_files=tuple(n for n, h in zip(names, held) if not h),
        held_out_files=tuple(n for n, h in zip(names, held) if h),
        sha256=hashlib.sha256(joined).hexdigest(),
        n_bytes=len(joined),
    )


def identity(corpus: Corpus) -> dict[str, object]:
    """What the results file records of the text: package, version, rule, sizes and SHA-256."""
    return {
        "package": PACKAGE,
        "version": VERSION,
        "files": len(corpus.train_files) + len(corpus.held_out_files),
        "bytes": corpus.n_bytes,
        "sha256": corpus.sha256,
        "joined_by": "\\n",
        "order": "paths relative to the package, sorted",
        "held_out": f"every {HELD_OUT_EVERY}th file in path order, from the first",
        "held_out_files": list(corpus.held_out_files),
        "train_bytes": int(corpus.train.numel()),
        "held_out_bytes": int(corpus.held_out.numel()),
        "vocabulary": f"bytes, {VOCAB_SIZE} symbols",
    }


def batch(text: Tensor, n: int, length: int, generator: torch.Generator) -> Tensor:
    """``n`` windows of ``length + 1`` bytes at uniformly random starts: ``[n, length + 1]``
    (inputs are ``[:, :-1]``, targets ``[:, 1:]``)."""
    starts = torch.randint(0, text.numel() - length - 1, (n,), generator=generator)
    return torch.stack([text[s : s + length + 1] for s in starts.tolist()])


def windows(text: Tensor, n: int, length: int) -> Tensor:
    """``n`` windows of ``length + 1`` bytes at evenly spaced starts, the same for every seed:
    ``[n, length + 1]``."""
    last = text.numel() - length - 1
    if last < n:
        raise ValueError(
            f"text of {text.numel()} bytes is too short for {n} windows of {length}"
        )
    starts = [(k * last) // n for k in range(n)]
    return torch.stack([text[s : s + length + 1] for s in starts])
