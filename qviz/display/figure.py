"""The matplotlib Figure every qviz view returns: it renders itself, with or without pyplot.

A ``matplotlib.figure.Figure`` made without pyplot has no notebook display of its own: only
``%matplotlib inline`` (or importing pyplot in a kernel) teaches IPython to draw one, so
``fig = monitor.plot(); fig`` showed ``<Figure size 1000x572 with 4 Axes>``. qviz never uses
pyplot (nothing is shown behind the caller's back), so its figures carry ``_repr_png_``.

Example:
    >>> fig = new_figure(figsize=(2, 1))
    >>> fig._repr_png_()[:4]
    b'\\x89PNG'
"""

from __future__ import annotations

import functools
import io
from typing import Any

from qviz.errors import MissingDependencyError


@functools.cache
def _figure_class() -> type:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency
        message = "qviz's figures need matplotlib: pip install matplotlib"
        raise MissingDependencyError(message) from exc

    class NotebookFigure(Figure):  # type: ignore[misc]
        """A Figure with ``_repr_png_``: Jupyter shows it as an image."""

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", bbox_inches="tight")
            return buffer.getvalue()

    return NotebookFigure


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure (``kwargs`` as ``Figure`` takes them) that shows itself as a PNG
    in a notebook and is not registered with pyplot.

    Raises:
        MissingDependencyError: matplotlib is not installed.

    Example:
        >>> new_figure(figsize=(3, 2)).get_size_inches().tolist()
        [3.0, 2.0]
    """
    return _figure_class()(**kwargs)
