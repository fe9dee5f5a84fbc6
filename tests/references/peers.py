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
from typing import Any

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


class Lazy:
    """A peer's module (``Lazy("transformers.models.phi3.modeling_phi3")``) or one of its names
    (``Lazy("diffusers.models.embeddings", "apply_rotary_emb")``), imported through :func:`require` when first
    used (an attribute read, or a call), not when pytest collects the test file. The peers' imports take seconds
    (diffusers and its Flux model 4.3 s, transformers' models 4.3 s, measured on this 2-core machine) and every
    pytest-xdist worker collects every file: only a worker that runs a test needing the peer pays for it."""

    def __init__(self, module: str, name: str | None = None) -> None:
        self._module, self._name = module, name

    def _target(self) -> Any:
        target = require(self._module)
        return target if self._name is None else getattr(target, self._name)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith(
            "_"
        ):  # copy, pickle and pytest probe these: not the peer's
            raise AttributeError(attribute)
        return getattr(self._target(), attribute)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"Lazy({self._module!r}{'' if self._name is None else f', {self._name!r}'})"
        )
