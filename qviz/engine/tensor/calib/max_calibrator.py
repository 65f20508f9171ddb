"""MaxCalibrator: the running maximum of |x|, per tensor or per kept axis.

Example:
    >>> import torch
    >>> calib = MaxCalibrator(8, axis=0)
    >>> calib.collect(torch.tensor([[1.0, -3.0], [0.5, 0.25]]))
    >>> calib.compute_amax()
    tensor([[3.0000],
            [0.5000]])
"""

from __future__ import annotations

import torch

from qviz.engine.tensor.calib.base import CalibMethod, Calibrator
from qviz.errors import ConfigError


class MaxCalibrator(Calibrator):
    """Track the largest |x| seen; ``compute_amax()`` returns it.

    Args:
        num_bits: bit width the amax is chosen for.
        axis: axes that keep their own amax (``0`` for per-output-channel weights).
        unsigned: negative inputs are an error.
        track_amax: also keep every batch's amax (``amaxs``), to plot how the range evolves.
        name: what error messages call the tensor.
        skip_nonfinite: skip NaN/Inf tensors with a warning instead of raising.

    Example:
        >>> import torch
        >>> calib = MaxCalibrator(track_amax=True)
        >>> calib.collect(torch.tensor([0.5, -2.0])); calib.collect(torch.tensor([1.0]))
        >>> float(calib.compute_amax()), [float(a) for a in calib.amaxs]
        (2.0, [2.0, 1.0])
    """

    def __init__(
        self,
        num_bits: int = 8,
        axis: int | tuple[int, ...] | None = None,
        unsigned: bool = False,
        track_amax: bool = False,
        *,
        name: str | None = None,
        skip_nonfinite: bool = False,
    ) -> None:
        self._track_amax = bool(track_amax)
        super().__init__(num_bits, axis, unsigned, name=name, skip_nonfinite=skip_nonfinite)

    def reset(self) -> None:
        super().reset()
        self._calib_amax: torch.Tensor | None = None
        self.amaxs: list[torch.Tensor] = []

    def collect(self, x: torch.Tensor) -> None:
        """Fold the max |x| of this tensor into the running max."""
        flat, keep = self._channels_first(x)
        local = self._extremes(flat, x.shape)
        if local is None:
            return
        device = self._bind(keep, flat.device)
        local = local.to(device, torch.float32)
        self._calib_amax = (
            local if self._calib_amax is None else torch.maximum(self._calib_amax, local)
        )
        if self._track_amax:
            self.amaxs.append(self._shape_amax(local).cpu())
        self.num_batches += 1
        self.num_elements += flat.numel()

    def compute_amax(self, method: CalibMethod | str = CalibMethod.MAX, **kwargs) -> torch.Tensor:
        """The running max; only ``method="max"`` is possible without a histogram."""
        if CalibMethod.parse(method) is not CalibMethod.MAX or kwargs:
            raise ConfigError(
                f"{self._label()} only keeps the running max, so it computes method='max' with no "
                f"options (got method={method!r}, {kwargs}); use HistogramCalibrator for "
                f"'percentile', 'entropy' or 'mse'"
            )
        self._require_data()
        return self._shape_amax(self._calib_amax)
