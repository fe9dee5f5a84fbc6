"""The torch versions each feature needs: the package's stated floors (README, pyproject.toml), as skip markers.

``make test-floor`` (``tools/floor_check.py``, run by ``.ci/run``) runs the package tests against the oldest torch
that ``pyproject.toml`` admits; a test of a feature with a higher floor is skipped there, saying which.
"""

from __future__ import annotations

import re

import pytest
import torch

TORCH_VERSION: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part)
    for part in re.match(r"(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
)
#: eager use of every function and of both modules (the ``torch>=`` floor in pyproject.toml)
EAGER_FLOOR = (2, 3)
#: ``torch.export`` of a model holding ``PositionalEncoding``
EXPORT_FLOOR = (2, 8)
#: ``torch.compile`` of ``PositionalEncoding``
COMPILE_FLOOR = (2, 12)


def _marker(floor: tuple[int, int], feature: str) -> pytest.MarkDecorator:
    wanted = ".".join(map(str, floor))
    return pytest.mark.skipif(
        TORCH_VERSION < floor,
        reason=f"{feature} needs torch >= {wanted} (stated floor); this is torch {torch.__version__}",
    )


needs_compile = _marker(COMPILE_FLOOR, "torch.compile of PositionalEncoding")
needs_export = _marker(EXPORT_FLOOR, "torch.export of PositionalEncoding")


def _has_python_backend() -> bool:
    from torch.utils import backend_registration

    return hasattr(backend_registration, "_setup_privateuseone_for_python_backend")


#: tests/references/host_syncs.py runs calls on a fake accelerator registered as a
#: Python backend, which older torch lacks
needs_fake_accelerator = pytest.mark.skipif(
    not _has_python_backend(),
    reason="tests/references/host_syncs.py's fake accelerator needs "
    "torch.utils.backend_registration._setup_privateuseone_for_python_backend, "
    f"which torch {torch.__version__} lacks",
)
