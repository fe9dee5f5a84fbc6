"""The package's structure in numbers: what issue-sized redesigns are measured by.

    python tools/structure.py            # this checkout
    python tools/structure.py --root DIR # another checkout (e.g. a `git worktree` of an older commit)

Printed: lines of code (docstrings, comments and blank lines excluded) of each public class and of its
``forward``; the exported notebook cells over 80 lines; private names that one module of the package imports from
another; import circles between the package's modules; the number of test files.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSES = (
    "PositionalEncoding",
    "RotaryEmbedding",
    "HFRotaryEmbedding",
    "Timesteps",
    "PositionEmbeddingSine",
)


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
        ):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - doc_lines)


def _segment(source: str, node: ast.AST) -> str:
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def _method_of(node: ast.AST) -> str | None:
    """The class a module-level function is a method of (``@method_of(Class)``: a class written over several
    notebook cells), or None."""
    for decorator in getattr(node, "decorator_list", ()):
        if (
            isinstance(decorator, ast.Call)
            and getattr(decorator.func, "id", "") == "method_of"
        ):
            return getattr(decorator.args[0], "id", None)
    return None


def classes(package: Path) -> dict[str, dict[str, int]]:
    """Lines of code of each public class (with the methods given to it by ``@method_of`` in later cells) and of
    its ``forward``."""
    found: dict[str, dict[str, int]] = {}
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            owner = node.name if isinstance(node, ast.ClassDef) else _method_of(node)
            if owner not in CLASSES:
                continue
            entry = found.setdefault(owner, {"class": 0})
            lines = code_lines(_segment(source, node))
            entry["class"] += lines
            items = node.body if isinstance(node, ast.ClassDef) else [node]
            for item in items:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    entry["forward"] = code_lines(_segment(source, item)) - (
                        item is node
                    )
    return found


def _module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path) -> tuple[list[str], list[list[str]]]:
    """Private names imported across the package's modules, and the import circles between its modules."""
    modules = {_module_name(package, p): p for p in package.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("posenc")
            ):
                target = node.module
                if target in modules and target != name:
                    if (
                        not name.startswith(target + ".")
                        and not path.name == "__init__.py"
                    ):
                        edges[name].add(target)
                    private += [
                        f"{name} <- {target}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
    circles, seen = [], set()
    for start in edges:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start and len(trail) > 1:
                    key = frozenset(trail)
                    if key not in seen:
                        seen.add(key)
                        circles.append(trail)
                elif nxt not in trail and len(trail) < 6:
                    stack.append((nxt, [*trail, nxt]))
    return private, circles


def long_cells(book: Path, limit: int = 80) -> list[str]:
    out = []
    for path in sorted(book.glob("*.ipynb")):
        for number, cell in enumerate(
            json.loads(path.read_text(encoding="utf-8"))["cells"], 1
        ):
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.lstrip().startswith("#| export"):
                n = len(source.splitlines())
                if n > limit:
                    out.append(f"{path.name} cell {number}: {n} lines")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    root = parser.parse_args().root.resolve()
    package = root / "posenc"
    for name, entry in sorted(classes(package).items()):
        print(
            f"{name}: {entry['class']} lines of code, forward {entry.get('forward', '-')}"
        )
    private, circles = imports(package)
    print(f"private names imported across modules: {len(private)}")
    print(
        f"import circles: {len(circles)}"
        + "".join(f"\n  {' -> '.join(c)}" for c in circles)
    )
    cells = long_cells(root / "book")
    print(
        f"exported cells over 80 lines: {len(cells)}"
        + "".join(f"\n  {c}" for c in cells)
    )
    tests = sorted(p for p in (root / "tests").rglob("test_*.py"))
    print(f"test files: {len(tests)}, in {len({p.parent for p in tests})} folders")


if __name__ == "__main__":
    main()
