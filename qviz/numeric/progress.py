"""One progress bar for the numeric suite's loops (a notebook widget in Jupyter).

Example:
    >>> list(progress_bar(range(3), False, "batches"))
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(items: Iterable[Any], enabled: bool, desc: str, total: int | None = None) -> Any:
    """``tqdm(items)``, disabled when ``enabled`` is false."""
    from tqdm.auto import tqdm

    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    return tqdm(items, total=total, desc=desc, disable=not enabled)
