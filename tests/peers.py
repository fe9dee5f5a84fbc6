"""The real peer packages the tests (and chapters) compare posenc with, imported as they are installed.

transformers, diffusers and rotary-embedding-torch import normally. timm is special: its package ``__init__``
imports torchvision, and PyPI's torchvision wheels are CUDA builds whose C extension cannot load beside the CPU
build of torch pinned here (``import torchvision`` fails with "operator torchvision::nms does not exist"). The
sin-cos and rotary tables posenc is compared with live in ``timm/layers/pos_embed_sincos.py``, which needs only
torch. :func:`timm_pos_embed_sincos` imports that installed file, the real one from site-packages, with the
``timm`` and ``timm.layers`` packages registered as namespaces (their ``__init__`` files are not run), so nothing
is copied and nothing imports torchvision. timm is installed with ``--no-deps`` (``requirements-nodeps.txt``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from pathlib import Path
from types import ModuleType

import pytest


def timm_version() -> str:
    """The installed timm's version (``importlib.metadata``); raises ``PackageNotFoundError`` without timm."""
    return importlib.metadata.version("timm")


def _timm_root() -> Path:
    dist = importlib.metadata.distribution("timm")
    return Path(str(dist.locate_file("timm/__init__.py"))).parent


def timm_module(name: str) -> ModuleType:
    """Import ``timm.<name>`` (e.g. ``"layers.pos_embed_sincos"``) from the installed timm, without running the
    ``__init__`` of ``timm`` or ``timm.layers`` (which import torchvision). Works whether or not the real
    ``timm`` package was imported first (then it is simply used)."""
    full = f"timm.{name}"
    if full in sys.modules:
        return sys.modules[full]
    root = _timm_root()
    parts = ["timm", *name.split(".")[:-1]]
    for depth in range(1, len(parts) + 1):
        package = ".".join(parts[:depth])
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(root.joinpath(*parts[1:depth]))]  # type: ignore[attr-defined]
            module.__package__ = package
            sys.modules[package] = module
    return importlib.import_module(full)


def timm_pos_embed_sincos() -> ModuleType:
    """timm's ``timm.layers.pos_embed_sincos`` (``build_sincos2d_pos_embed``, ``build_fourier_pos_embed``,
    ``RotaryEmbeddingCat``, ...), the installed file."""
    return timm_module("layers.pos_embed_sincos")


def require(package: str) -> ModuleType:
    """Import ``package``, or fail the test (never skip: the peers are pinned in requirements.txt and must be
    there wherever the full suite runs). The package-only floor check (tools/floor_check.py) deselects the tests
    that need them: in its files, such tests are marked ``peers`` (tests/test_package.py checks that)."""
    try:
        return importlib.import_module(package)
    except ImportError as error:  # pragma: no cover - a broken environment
        pytest.fail(
            f"{package} is pinned in requirements.txt but does not import: {error}"
        )
