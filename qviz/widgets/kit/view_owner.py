"""What every qviz widget shares: its ipywidgets belong to its ``view``, and it shows itself.

A widget class keeps its state and public methods; its View class builds and owns the
ipywidgets. Subclassing :class:`ViewOwner` gives the widget ``.widget`` (the view's box) and
lets Jupyter display the widget object itself.

Example:
    >>> import ipywidgets
    >>> class View:
    ...     widget = ipywidgets.HTML("hello")
    >>> class Hello(ViewOwner):
    ...     view = View()
    >>> Hello().widget.value
    'hello'
"""

from __future__ import annotations

from typing import Any


class ViewOwner:
    """Base of a widget whose ipywidgets belong to ``self.view``."""

    view: Any

    @property
    def widget(self) -> Any:
        """The ipywidgets box of this widget (its :attr:`view`'s)."""
        return self.view.widget

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
