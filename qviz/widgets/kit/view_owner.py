"""What every qviz widget shares: its ipywidgets belong to its ``view``, and it shows itself.

A widget class keeps its state and public methods; its View class builds and owns the
ipywidgets. Subclassing :class:`ViewOwner` gives the widget ``.widget`` (the view's box), lets
Jupyter display the widget object itself, and gives its state changes one guard
(:meth:`ViewOwner._guard`): a QvizError is shown in the view, never raised into a callback.

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

from collections.abc import Callable
from typing import Any

from qviz.errors import QvizError

_NO_STATE = object()


class ViewOwner:
    """Base of a widget whose ipywidgets belong to ``self.view``."""

    view: Any
    error: str | None = None

    def _guard(self, action: Callable[[], Any]) -> Any:
        """Run the state change ``action``; a QvizError becomes :attr:`error` (shown by the
        view) and gives back the ``state`` held before, where the widget keeps one; the view
        refreshes either way. Returns the widget, so calls chain."""
        before = getattr(self, "state", _NO_STATE)
        try:
            action()
            self.error = None
        except QvizError as exc:
            if before is not _NO_STATE:
                self.state = before
            self.error = str(exc)
        self.view.refresh()
        return self

    @property
    def widget(self) -> Any:
        """The ipywidgets box of this widget (its :attr:`view`'s)."""
        return self.view.widget

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
