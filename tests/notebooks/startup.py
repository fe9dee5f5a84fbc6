"""IPython start-up file of the notebook kernels of a test run (``PYTHONSTARTUP``, set by tests/notebooks/plugin.py).

nbval compares a figure's ``text/plain`` (``<Figure size 800x520 with 15 Axes>``), never its image: nbval drops
``image/png`` from both sides before comparing. The inline backend would still render every figure twice (once
for the tight bounding box, once for the image) and compress it into a PNG. Here, a PNG-kind figure is drawn
once with Agg at its own dpi and no image is made: a draw-time error (bad mathtext, a failing artist) still
surfaces in the cell's output and fails the test; only the second pass and the encoding are skipped. Measured
on this 2-core machine: chapter 08's cells (nine figures) took 17.1 s with PNGs, 10.9 s with each figure drawn
once (one run each); in whole test runs the notebooks took 147 worker-seconds in one run before, 111-128 in
three runs after.

Nothing is left in the notebook's namespace. ``make notebooks`` (tools/nbrun.py) does not use this file: the
stored outputs, and the book, keep their real PNGs.
"""


def _draw_figures_without_encoding() -> None:
    from IPython.core import pylabtools

    real = pylabtools.print_figure
    if getattr(real, "_posenc_draw_only", False):
        return

    def draw_only(
        fig: object,
        fmt: str = "png",
        bbox_inches: object = "tight",
        base64: bool = False,
        **kwargs: object,
    ) -> object:
        """IPython's ``print_figure`` for raster formats, without the image: draw ``fig`` once, return None
        (no ``image/png`` in the output). Empty figures are skipped as IPython skips them."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        raster = fmt in ("png", "retina", "jpeg", "jpg")
        if not raster or not isinstance(fig.canvas, FigureCanvasAgg):  # type: ignore[attr-defined]
            return real(fig, fmt, bbox_inches, base64, **kwargs)
        if not fig.axes and not fig.lines:  # type: ignore[attr-defined]
            return None
        fig.canvas.draw()  # type: ignore[attr-defined]
        return None

    draw_only._posenc_draw_only = True  # type: ignore[attr-defined]
    pylabtools.print_figure = draw_only


_draw_figures_without_encoding()
del _draw_figures_without_encoding
