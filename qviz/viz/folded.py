"""What a notebook cell prints and shows, folded under a one-line summary that the reader
clicks to open: an exercise's solution whose numbers should not be on screen before the reader
has tried it.

JupyterLab unfolds a cell's outputs whenever the cell runs (a cell's ``outputs_hidden``
metadata does not survive "Run All"), so output that must stay folded folds itself: inside
``with folded(summary):`` the printed text and every value shown (tables, figures, graphs) are
collected and shown as one closed ``<details>`` element. Its text form holds all the printed
text, so a test or a plain-text view still reads the numbers.

Example:
    >>> with folded("the answer") as box:
    ...     print(6 * 7)
    >>> box.text
    '42\\n'
    >>> box._repr_html_().startswith('<details class="qviz-folded"><summary>the answer')
    True
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Outputs a fold leaves out: widget views (progress bars) cannot render inside HTML.
_WIDGET = "application/vnd.jupyter.widget-view+json"


class Folded:
    """The collected output of a :func:`folded` block: ``text`` (what was printed, then each
    shown value's text form) and the HTML of a closed ``<details>`` element holding it all."""

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.text = ""
        self._parts: list[str] = []

    def add_text(self, text: str) -> None:
        """Add printed text."""
        if text:
            self.text += text
            self._parts.append(f"<pre>{html.escape(text)}</pre>")

    def add_output(self, data: dict[str, Any]) -> None:
        """Add a shown value, given as its mime bundle (``{"text/html": ..., ...}``)."""
        if _WIDGET in data:
            return
        plain = str(data.get("text/plain", ""))
        if "text/html" in data:
            self._parts.append(str(data["text/html"]))
        elif "image/svg+xml" in data:
            self._parts.append(str(data["image/svg+xml"]))
        elif "image/png" in data:
            png = data["image/png"]
            png = png if isinstance(png, str) else base64.b64encode(png).decode()
            self._parts.append(f'<img src="data:image/png;base64,{png}"/>')
        elif plain:
            self._parts.append(f"<pre>{html.escape(plain)}</pre>")
        if plain:
            self.text += plain + "\n"

    def _repr_html_(self) -> str:
        summary = f"<summary>{html.escape(self.summary)}</summary>"
        return f'<details class="qviz-folded">{summary}{"".join(self._parts)}</details>'

    def __repr__(self) -> str:
        return f"{self.summary}\n{self.text}"


@contextmanager
def folded(summary: str = "output (click to open)") -> Iterator[Folded]:
    """Collect what the block prints and shows; in a notebook, show it folded under ``summary``.

    Args:
        summary: the line shown while the output is folded.

    Yields:
        The :class:`Folded` collection (filled when the block ends).

    Example:
        >>> with folded("solution's output") as box:
        ...     print("measured 99.7%")
        >>> "measured 99.7%" in box.text and "<details" in box._repr_html_()
        True
    """
    from IPython import get_ipython
    from IPython.display import display
    from IPython.utils.capture import capture_output

    box = Folded(summary)
    with capture_output(stdout=True, stderr=False, display=True) as captured:
        yield box
    box.add_text(captured.stdout)
    for output in captured.outputs:
        box.add_output(output.data)
    if get_ipython() is not None:
        display(box)
