"""One progress bar for the numeric suite's loops (a notebook widget in Jupyter).

A loop that ends early by design calls :meth:`Progress.stop` with the reason before it breaks:
the bar's total shrinks to the work done and the reason is shown beside it, so the bar ends
finished (green in Jupyter) rather than short of its total, which Jupyter draws red as a
failure. A loop left by an exception keeps the bar short of its total, as tqdm shows failures.

Example:
    >>> list(progress_bar(range(3), False, "batches"))
    [0, 1, 2]
    >>> bar = progress_bar(range(5), False, "probes")
    >>> for i in bar:
    ...     if i == 2:
    ...         bar.stop("found after 2")
    ...         break
    >>> bar.bar.n, bar.bar.total
    (2, 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class Progress:
    """``items`` iterated with a tqdm bar (``bar``); see :func:`progress_bar`."""

    def __init__(self, items: Iterable[Any], enabled: bool, desc: str, total: int | None) -> None:
        from tqdm.auto import tqdm

        if total is None and hasattr(items, "__len__"):
            total = len(items)  # type: ignore[arg-type]
        self._items = items
        self.done = 0  # items the loop body finished (a disabled tqdm bar counts nothing)
        self.bar = tqdm(total=total, desc=desc, disable=not enabled)

    def __iter__(self) -> Iterator[Any]:
        # The bar counts each item once the loop body is done with it; tqdm's own iterator is
        # not used, as it marks a bar failed whenever the loop is left early, break included.
        try:
            for item in self._items:
                yield item
                self.done += 1
                self.bar.update()
        finally:
            self.bar.close()  # short of its total (a raise or a bare break): failed

    def stop(self, reason: str) -> None:
        """End the bar now as finished, at the items done so far, with ``reason`` beside it;
        call it right before a ``break`` that ends the loop by design."""
        bar, done = self.bar, self.done
        if bar.disable:
            bar.n = bar.total = done
            return
        start = bar.start_t
        bar.reset(total=done)  # a notebook bar's length follows the new total
        bar.start_t = start  # keep the time elapsed
        bar.update(done)
        bar.set_postfix_str(reason, refresh=False)
        bar.close()


def progress_bar(
    items: Iterable[Any], enabled: bool, desc: str, total: int | None = None
) -> Progress:
    """``items`` with a progress bar (tqdm's, a widget in Jupyter), disabled when ``enabled``
    is false; ``total`` defaults to ``len(items)``. A loop that stops early by design calls
    ``stop(reason)`` on it before breaking, so the bar ends finished and says why.

    Example:
        >>> bar = progress_bar(iter("abc"), False, "letters", total=3)
        >>> [x for x in bar], bar.bar.total
        (['a', 'b', 'c'], 3)
    """
    return Progress(items, enabled, desc, total)
