"""Every figure of the book is drawn with book/posenc.mplstyle, checked from the notebooks alone (no browser).

The style fixes what a reader's screen needs (see its header): figures at most 6.2 in wide at 100 dpi, no text
under 10.5 pt, at most two panels side by side. A stored PNG's text cannot be measured, so tests/book/test_layout.py
derives it: the displayed scale of each image times the style's smallest font (14.6 px at 100 dpi) must read at
10 px or more at a 1280 px window and 8 px or more at 390 px. That holds only if every figure really is drawn
with the style at its sizes, which is what this file checks:

- **the style's contract**: width at most 6.2 in, the smallest font (read from the file: the minimum of font.size
  and every ``*labelsize``, ``*titlesize``, ``*fontsize``) at least 10.5 pt, figure.dpi equal to savefig.dpi, and
  with those numbers a figure meets the browser's bars in the columns measured there;
- **every notebook that draws** (stores a PNG or imports matplotlib) applies the style in its first code cell,
  never swaps it for another (``style.use``, ``style.context``, ``rcdefaults``), and passes no font size below the
  style's minimum anywhere: ``fontsize=``, ``labelsize=``, ``titlesize=``, ``size=`` of a text call, a ``size`` in
  ``prop``/``fontdict``/``textprops`` dicts, ``set_fontsize``/``set_size``, and rcParams font sizes however set
  (item, ``update``, ``rc``, ``rc_context``). A size the scan cannot read as a number (a variable not assigned a
  literal in the notebook) counts as a failure: write the number, or leave the style's size. It also reads
  ``figsize`` widths and ``subplots`` columns where they are literals (at most 6.2 in, at most two panels), and
  flags a cross-reference label (``eq-rope-decay``) written into a figure's text, where it shows literally;
- **every stored figure** (image/png outputs, and the frames of an animation's HTML player) was saved at the
  style's dpi and is at most 6.2 in × 100 dpi + the inline backend's tight-bounding-box margins (0.1 in a side):
  640 px wide.

Each failure lists the offending cells or figures of the notebook, so that whoever owns it can fix it.
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from tests.book.browser_helpers import (
    FIGURE_PX,
    MIN_TEXT_PX,
    figure_style,
    font_size_keys,
    font_size_pt,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]
STYLE = figure_style()
#: The contract the notebooks are written to (book/posenc.mplstyle's header).
MAX_WIDTH_IN = 6.2
MIN_FONT_PT = 10.5
MAX_PANELS_ACROSS = 2

#: Calls whose ``size=`` is a text size (elsewhere ``size=`` is a tensor's or an array's).
TEXT_CALLS = {
    "text", "annotate", "figtext", "title", "set_title", "suptitle", "supxlabel", "supylabel", "xlabel",
    "ylabel", "set_xlabel", "set_ylabel", "legend", "clabel", "bar_label", "table", "tick_params",
    "set_xticklabels", "set_yticklabels", "FontProperties", "Text", "label_outer", "set_label_text",
}  # fmt: skip
#: Keywords whose string is drawn into a figure (a legend entry, a title, an axis label).
TEXT_KEYWORDS = {"label", "title", "xlabel", "ylabel", "text", "s"}
#: A cross-reference label (the book's start eq-, fig-, sec-), which a figure would show literally.
RAW_LABEL = re.compile(r"\b(?:eq|fig|sec)-[a-z0-9][\w-]*")
SIZE_KEYWORDS = {"fontsize", "labelsize", "titlesize", "title_fontsize"}
DICT_KEYWORDS = {
    "prop",
    "fontdict",
    "textprops",
    "title_fontproperties",
    "fontproperties",
}
#: Every rcParams key that sets a text size.
FONT_KEYS = set(font_size_keys(matplotlib.rcParams))
STYLE_CALL = re.compile(r"posenc\.mplstyle$")
PNG_IN_HTML = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=\\n]+)")


def code_cells(nb: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``(index, cell)`` of every code cell, index counted over all cells (as nbval and tests/ name them)."""
    return [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def parse_cell(source: str) -> ast.Module | None:
    """A code cell's AST with IPython's line magics and shell escapes blanked; None for a cell magic."""
    if source.lstrip().startswith("%%"):
        return None
    lines = [
        "" if line.lstrip().startswith(("%", "!")) else line
        for line in source.splitlines()
    ]
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    return compile("\n".join(lines), "<cell>", "exec", flags=flags)


def call_name(node: ast.Call) -> str:
    """The called name: ``ax.set_title(...)`` -> ``"set_title"``, ``FontProperties(...)`` -> its name."""
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def dotted(node: ast.AST) -> str:
    """``plt.style.use`` -> ``"plt.style.use"`` (empty for anything but names and attributes)."""
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


class Scan:
    """What one notebook's code does about figure style, as ``cell N: problem`` lines."""

    def __init__(self, nb: dict[str, Any]) -> None:
        self.cells = code_cells(nb)
        self.trees: list[tuple[int, ast.Module | None]] = []
        self.problems: list[str] = []
        for index, cell in self.cells:
            try:
                self.trees.append((index, parse_cell("".join(cell["source"]))))
            except SyntaxError as error:
                self.problems.append(
                    f"cell {index}: cannot be parsed to check ({error.msg})"
                )
        # names assigned one numeric literal anywhere (FONT = 11): sizes passed by name are read through them
        self.constants: dict[str, Any] = {}
        for _, tree in self.trees:
            for node in ast.walk(tree) if tree else []:
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    try:
                        self.constants[node.targets[0].id] = ast.literal_eval(
                            node.value
                        )
                    except ValueError:
                        pass

    def value(self, node: ast.AST) -> Any:
        """The literal ``node`` stands for (through a name assigned a literal), or raise ValueError."""
        if isinstance(node, ast.Name) and node.id in self.constants:
            return self.constants[node.id]
        return ast.literal_eval(node)

    def font(self, index: int, what: str, node: ast.AST) -> None:
        """Record a problem when the font size ``node`` is below the style's minimum or cannot be read."""
        try:
            raw = self.value(node)
            if raw is None:
                return  # the style's own size
            size = font_size_pt(raw, STYLE.font_pt)
        except (ValueError, TypeError, KeyError):
            self.problems.append(
                f"cell {index}: {what}={ast.unparse(node)} is not a size this check can read "
                f"(write a number >= {STYLE.min_font_pt} pt, or leave the style's size)"
            )
            return
        if size < STYLE.min_font_pt - 1e-9:
            self.problems.append(
                f"cell {index}: {what}={ast.unparse(node)} is {size:g} pt, under the style's "
                f"{STYLE.min_font_pt} pt"
            )

    def width(self, index: int, what: str, node: ast.AST) -> None:
        """Record a problem when a literal figure width is over the style's."""
        try:
            size = self.value(node)
        except ValueError:
            return  # not a literal: the stored PNG's width is checked instead
        if (
            isinstance(size, (tuple, list))
            and size
            and isinstance(size[0], (int, float))
        ):
            if size[0] > STYLE.width_in + 1e-9:
                self.problems.append(
                    f"cell {index}: {what} {ast.unparse(node)} is {size[0]} in wide, over the "
                    f"style's {STYLE.width_in} in"
                )

    def panels(self, index: int, what: str, columns: Any) -> None:
        if isinstance(columns, int) and columns > MAX_PANELS_ACROSS:
            self.problems.append(
                f"cell {index}: {what} puts {columns} panels side by side (at most "
                f"{MAX_PANELS_ACROSS}: stack the others below)"
            )

    def rc(self, index: int, key: str, node: ast.AST) -> None:
        """An rcParams setting: font sizes against the minimum, figsize against the width."""
        if key in FONT_KEYS:
            self.font(index, f"rcParams[{key!r}]", node)
        elif key == "figure.figsize":
            self.width(index, "rcParams['figure.figsize']", node)

    def rc_dict(self, index: int, node: ast.AST) -> None:
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    self.rc(index, key.value, value)

    def run(self) -> list[str]:
        for index, tree in self.trees:
            for node in ast.walk(tree) if tree else []:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if (
                            isinstance(target, ast.Subscript)
                            and dotted(target.value).endswith("rcParams")
                            and isinstance(target.slice, ast.Constant)
                        ):
                            self.rc(index, str(target.slice.value), node.value)
                if isinstance(node, ast.Call):
                    self.call(index, node)
        return self.problems

    def call(self, index: int, node: ast.Call) -> None:
        name, full = call_name(node), dotted(node.func)
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        for key, value in keywords.items():
            if key in SIZE_KEYWORDS or (key == "size" and name in TEXT_CALLS):
                self.font(index, key, value)
            elif key in DICT_KEYWORDS and isinstance(value, ast.Dict):
                for k, v in zip(value.keys, value.values):
                    if isinstance(k, ast.Constant) and k.value in ("size", "fontsize"):
                        self.font(index, f"{key}[{k.value!r}]", v)
            elif key == "figsize":
                self.width(index, "figsize", value)
        drawn = [*node.args] if name in TEXT_CALLS or name == "set" else []
        drawn += [v for k, v in keywords.items() if k in TEXT_KEYWORDS]
        for text in (n for arg in drawn for n in ast.walk(arg)):
            if isinstance(text, ast.Constant) and isinstance(text.value, str):
                for label in RAW_LABEL.findall(text.value):
                    self.problems.append(
                        f"cell {index}: the figure draws the label {label!r} as text (name what it is, "
                        "or the equation's number)"
                    )
        if name in ("set_fontsize", "set_size") and node.args:
            self.font(index, name, node.args[0])
        if name == "set_size_inches" and node.args:
            self.width(
                index,
                "set_size_inches",
                node.args[0] if len(node.args) == 1 else ast.Tuple(node.args),
            )
        if full.endswith("rcParams.update") and node.args:
            self.rc_dict(index, node.args[0])
        if name == "rc_context":
            for arg in [*node.args[:1], *[v for k, v in keywords.items() if k == "rc"]]:
                self.rc_dict(index, arg)
        if name == "rc" and node.args and isinstance(node.args[0], ast.Constant):
            group = str(node.args[0].value)
            for key, value in keywords.items():
                self.rc(index, f"{group}.{key}", value)
        if name in ("use", "context") and full.split(".")[-2:-1] == ["style"]:
            target = node.args[0] if node.args else keywords.get("style")
            style = self.literal_or_none(target)
            if not (isinstance(style, str) and STYLE_CALL.search(style)):
                self.problems.append(
                    f"cell {index}: {full}({ast.unparse(target) if target else ''}) replaces "
                    "book/posenc.mplstyle"
                )
        if name == "rcdefaults":
            self.problems.append(f"cell {index}: {full}() resets book/posenc.mplstyle")
        self.call_panels(index, node, name, keywords)

    def literal_or_none(self, node: ast.AST | None) -> Any:
        try:
            return self.value(node) if node is not None else None
        except ValueError:
            return None

    def call_panels(
        self, index: int, node: ast.Call, name: str, keywords: dict[str, ast.AST]
    ) -> None:
        """At most two panels side by side: ``subplots(r, c)``, ``add_subplot(r, c, i)``, ``subplot_mosaic``."""
        args = [self.literal_or_none(a) for a in node.args]
        if name == "subplots":
            columns = keywords.get("ncols")
            self.panels(
                index,
                "subplots",
                self.literal_or_none(columns)
                if columns
                else (args[1] if len(args) > 1 else 1),
            )
        elif name in ("add_subplot", "subplot"):
            if len(args) >= 3:
                self.panels(index, name, args[1])
            elif len(args) == 1 and isinstance(args[0], int) and 100 <= args[0] < 1000:
                self.panels(index, name, args[0] // 10 % 10)
        elif name == "subplot_mosaic" and args:
            mosaic = args[0]
            rows = (
                [r.strip() for r in re.split(r"[;\n]", mosaic) if r.strip()]
                if isinstance(mosaic, str)
                else mosaic
            )
            if isinstance(rows, (list, tuple)):
                self.panels(
                    index, "subplot_mosaic", max((len(set(r)) for r in rows), default=1)
                )


def draws(nb: dict[str, Any]) -> bool:
    """Whether a notebook draws: it stores a PNG (or an HTML animation of PNG frames) or imports matplotlib."""
    for _, cell in code_cells(nb):
        if re.search(
            r"^\s*(?:import|from)\s+matplotlib", "".join(cell["source"]), re.M
        ):
            return True
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data or "data:image/png" in "".join(
                data.get("text/html", "")
            ):
                return True
    return False


def applies_style_first(nb: dict[str, Any]) -> bool:
    """Whether the first code cell calls ``<...>.style.use("...posenc.mplstyle")``."""
    cells = code_cells(nb)
    if not cells:
        return False
    tree = parse_cell("".join(cells[0][1]["source"]))
    for node in ast.walk(tree) if tree else []:
        if (
            isinstance(node, ast.Call)
            and dotted(node.func).endswith("style.use")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and STYLE_CALL.search(str(node.args[0].value))
        ):
            return True
    return False


def png_size(data: bytes) -> tuple[int, int, float | None]:
    """``(width, height, dpi)`` of a PNG from its IHDR and pHYs chunks (dpi None without pHYs)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    dpi, position = None, 8
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        if kind == b"pHYs":
            x, _, unit = struct.unpack(">IIB", data[position + 8 : position + 17])
            dpi = x * 0.0254 if unit == 1 else None
        if kind in (b"IDAT", b"IEND"):
            break
        position += 12 + length
    return width, height, dpi


def stored_pngs(nb: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    """``(where, png bytes)`` for every stored figure: image/png outputs and an HTML player's frames."""
    for index, cell in code_cells(nb):
        name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
        where = f"cell {index}" + (f" ({name})" if name else "")
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                yield where, base64.b64decode("".join(data["image/png"]))
            html = "".join(data.get("text/html", ""))
            for frame, found in enumerate(PNG_IN_HTML.finditer(html)):
                encoded = found.group(1).replace("\\n", "").replace("\n", "")
                yield f"{where}, frame {frame}", base64.b64decode(encoded)


@functools.cache
def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# ---- the style's own contract ---------------------------------------------------------------------------------


def test_the_style_keeps_its_contract() -> None:
    assert STYLE.width_in <= MAX_WIDTH_IN, (
        f"book/posenc.mplstyle draws figures {STYLE.width_in} in wide, over {MAX_WIDTH_IN} in"
    )
    assert STYLE.min_font_pt >= MIN_FONT_PT, (
        f"book/posenc.mplstyle's {STYLE.min_font_key} is {STYLE.min_font_pt} pt, under {MIN_FONT_PT} pt"
    )
    assert STYLE.dpi == STYLE.savefig_dpi == 100, (
        f"figure.dpi {STYLE.dpi} and savefig.dpi {STYLE.savefig_dpi}: both must be 100 (the inline backend "
        "saves at the figure's dpi, and the browser tests derive text sizes from it)"
    )


def test_a_style_figure_meets_the_browser_bars() -> None:
    """The widest figure the style draws, scaled into the columns tests/book/test_layout.py measures, still shows its
    smallest text at the bars there (10 px at 1280 px, 8 px at 390 px)."""
    for viewport, room in FIGURE_PX.items():
        scale = min(1.0, room / STYLE.max_png_width)
        text_px = scale * STYLE.min_font_px
        assert text_px >= MIN_TEXT_PX[viewport], (
            f"{viewport}: a {STYLE.max_png_width:.0f} px figure shown in {room} px reads its "
            f"{STYLE.min_font_pt} pt text at {text_px:.2f} px < {MIN_TEXT_PX[viewport]} px"
        )


def test_the_style_is_read_as_matplotlib_reads_it(tmp_path: Path) -> None:
    # a relative size ("small") is taken against font.size, and the smallest setting wins
    style = tmp_path / "s.mplstyle"
    style.write_text("figure.figsize: 5, 3\nfont.size: 12\nxtick.labelsize: small\n")
    read = figure_style.__wrapped__(style)
    assert (read.width_in, read.min_font_key) == (5.0, "xtick.labelsize")
    assert read.min_font_pt == pytest.approx(0.833 * 12)


# ---- the scan itself can fail -----------------------------------------------------------------------------------


def scan_source(*cells: str) -> list[str]:
    nb = {"cells": [{"cell_type": "code", "source": c, "outputs": []} for c in cells]}
    return Scan(nb).run()


def test_the_scan_finds_small_fonts_wide_figures_and_third_panels() -> None:
    bad = [
        "ax.legend(fontsize=8)",
        "ax.tick_params(labelsize='small')",
        "ax.text(0, 0, 'a', size=9)",
        "ax.legend(prop={'size': 7})",
        "plt.rcParams.update({'font.size': 8.5, 'axes.titlesize': 9})",
        "plt.rcParams['xtick.labelsize'] = 8",
        "plt.rc('font', size=9)",
        "t.set_fontsize(6)",
        "S = 8\nax.set_title('t', fontsize=S)",
        "ax.set_xlabel('x', fontsize=size_of_label)",
        "fig, ax = plt.subplots(figsize=(8, 3))",
        "fig, axes = plt.subplots(1, 3)",
        "fig = plt.figure(); fig.add_subplot(131)",
        "plt.style.use('ggplot')",
        "plt.rcdefaults()",
        "ax.plot(x, y, label='relative bound (eq-rope-decay)')",
    ]
    good = [
        "ax.legend(fontsize=11)",
        "ax.tick_params(labelsize='large')",
        "x = torch.randint(0, 5, size=3)",
        "np.random.normal(size=10)",
        "fig, ax = plt.subplots(2, 2, figsize=(6.2, 5))",
        "plt.style.use('posenc.mplstyle')",
        "%matplotlib inline\nax.set_title('t')",
        "ax.plot(x, y, label='frequency (Hz)')",
    ]
    assert [bool(scan_source(c)) for c in bad] == [True] * len(bad), [
        c for c in bad if not scan_source(c)
    ]
    assert [scan_source(c) for c in good] == [[]] * len(good)


def test_png_size_reads_width_and_dpi() -> None:
    import io

    import matplotlib.style
    from matplotlib.figure import Figure

    with matplotlib.style.context(str(ROOT / "book" / "posenc.mplstyle")):
        buffer = io.BytesIO()
        Figure().savefig(buffer, format="png")
    width, height, dpi = png_size(buffer.getvalue())
    assert (width, height) == (620, 340) and dpi == pytest.approx(100, abs=0.1)


# ---- every notebook -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_applies_the_style_first(path: Path) -> None:
    nb = load(path)
    if not draws(nb):
        return
    applied = applies_style_first(nb)
    assert applied, (
        f"{path.name} draws figures but its first code cell does not run "
        'plt.style.use("posenc.mplstyle") (notebooks run with cwd book/)'
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_passes_no_smaller_font_or_wider_figure(path: Path) -> None:
    nb = load(path)
    if not draws(nb):
        return
    problems = Scan(nb).run()
    assert not problems, (
        f"{path.name} overrides book/posenc.mplstyle ({len(problems)}):\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_figures_fit_the_style(path: Path) -> None:
    problems = []
    for where, png in stored_pngs(load(path)):
        width, _, dpi = png_size(png)
        if width > STYLE.max_png_width + 1:
            problems.append(
                f"{where}: {width} px wide, over {STYLE.max_png_width:.0f} px ({STYLE.width_in} in at "
                f"{STYLE.dpi:.0f} dpi + {STYLE.pad_in} in margins)"
            )
        if dpi is not None and abs(dpi - STYLE.dpi) > 0.5:
            problems.append(
                f"{where}: saved at {dpi:.0f} dpi, not the style's {STYLE.dpi:.0f}"
            )
    assert not problems, (
        f"{path.name}: stored figures not drawn at book/posenc.mplstyle's size ({len(problems)}):\n  "
        + "\n  ".join(problems)
    )
