"""Which families of the installed transformers define a rotary embedding, read from their modeling code.

A family is a folder of ``transformers/models``; it counts when one of its ``modeling_*.py`` files defines a class
whose name contains ``RotaryEmbedding``, or a class that behaves as one, whatever it is called: a class named for
rotary position embeddings (``Rotary`` or ``Rope`` with ``Embedding``: ``Wav2Vec2ConformerRotaryPositionalEmbedding``,
``DINOv3ViTRopePositionEmbedding``), or one that stores inverse frequencies (``self.inv_freq = ...`` or
``register_buffer("inv_freq", ...)``) in a module that rotates with them (it defines ``rotate_half`` or an
``apply_rotary...`` function: Parakeet's relative positional encoding). A class that stores inv_freq for a
sinusoidal table that nothing rotates with (Bros) does not count. The source is parsed, not imported: discovering
the families costs no import of their modeling code.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

#: a class named for a rotary embedding without "RotaryEmbedding" in its name
_ROTARY_NAME = re.compile(r"(Rotary|Rope|RoPE)\w*Embedding")


@dataclass(frozen=True)
class Family:
    """A family of the installed transformers with rotary classes."""

    name: str  # the folder under transformers/models (usually its model_type)
    modules: tuple[str, ...]  # its modeling modules that define rotary classes
    named: tuple[str, ...]  # classes named *RotaryEmbedding*
    behaving: tuple[str, ...]  # other classes that store inv_freq


def _stores_inv_freq(node: ast.ClassDef) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any(
                isinstance(t, ast.Attribute) and t.attr == "inv_freq" for t in targets
            ):
                return True
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "register_buffer"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
            and sub.args[0].value == "inv_freq"
        ):
            return True
    return False


def models_folder() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the census needs transformers installed")
    return Path(spec.origin).parent / "models"


def families() -> list[Family]:
    """Every family whose modeling code defines a rotary class, sorted by name."""
    found = []
    for folder in sorted(p for p in models_folder().iterdir() if p.is_dir()):
        modules, named, behaving = [], [], []
        for path in sorted(folder.glob("modeling_*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
            mine_named = [c.name for c in classes if "RotaryEmbedding" in c.name]
            rotates = any(
                isinstance(n, ast.FunctionDef)
                and (n.name == "rotate_half" or n.name.startswith("apply_rotary"))
                for n in tree.body
            )
            mine_behaving = [
                c.name
                for c in classes
                if "RotaryEmbedding" not in c.name
                and (_ROTARY_NAME.search(c.name) or (rotates and _stores_inv_freq(c)))
            ]
            if mine_named or mine_behaving:
                modules.append(f"transformers.models.{folder.name}.{path.stem}")
                named += mine_named
                behaving += mine_behaving
        if modules:
            found.append(
                Family(folder.name, tuple(modules), tuple(named), tuple(behaving))
            )
    return found
