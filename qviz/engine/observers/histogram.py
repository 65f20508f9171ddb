"""HistogramObserver: a running histogram; qparams by torch's L2 search or a calibrator method.

The default ``method="l2"`` reproduces torch's HistogramObserver bit for bit: the same histogram
(``bins`` float32 counts over the running ``[min_val, max_val]``; when a batch widens the range
the old counts are re-binned onto the new one, see :mod:`~qviz.engine.observers.binning`) and the
same L2 search for the range to quantize with (:mod:`~qviz.engine.observers.l2_search`).

The other methods, ``"max"``, ``"percentile"``, ``"entropy"`` and ``"mse"``, are computed by
:class:`~qviz.engine.tensor.calib.HistogramCalibrator` (the single implementation of each), fed the
same batches. It returns a clipping threshold ``amax`` on ``|x|``; symmetric qschemes quantize
``[-amax, amax]``, affine ones the observed ``[min_val, max_val]`` clipped to ``[-amax, amax]``.

**Switching methods after calibration.** With ``switchable=True`` the observer keeps both
statistics, so ``obs.method = "entropy"`` or ``calculate_qparams(method="mse")`` works on a
calibrated observer without re-running data.
Measured forward cost on a (8, 64, 56, 56) float32 activation, 2 CPU threads (median):

===============================================  ==========
torchao HistogramObserver                        13 ms
qviz, ``switchable=False`` (one histogram)       2.5-3 ms
qviz, ``switchable=True`` (L2 + calibrator)      5.5-6.5 ms
(a 64->64 3x3 conv on that activation)           55 ms
===============================================  ==========

The calibrator roughly doubles the cost (both histograms together still cost about half the
reference's one). On whole models that is the difference between calibrating resnet18 at about
1.2x and 1.4x its float forward time, so by default an observer keeps only what ``method``
needs; pass ``switchable=True`` (e.g. ``HistogramObserver.with_args(switchable=True)`` in a
QuantizationSpec) for observers whose method a user will explore after calibration.

**Batch order and distributed calibration.** Because a wider range re-bins the old counts
(lossily), the histogram, and so the L2 range, depend on the order of the batches whenever the
range grows after the first one. Calibrating on several processes therefore merges to a result
within one process's own spread over batch orders (bit for bit only when no rank's range grows;
:mod:`qviz.engine.distributed.sharded` has the measurement).
:class:`~qviz.engine.observers.OrderFreeHistogramObserver` runs the same L2 search on a
histogram that is the same for any order and sharding.

On CUDA the histograms use the same torch operations as the reference; the L2 search runs on a
CPU copy of the (``bins``-long) histogram, while torch runs it on the GPU, whose division
kernels may round differently, so GPU results are not guaranteed bit-identical (untested).

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> obs = HistogramObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric,
    ...                         switchable=True)
    >>> _ = obs(torch.randn(10_000, generator=g))
    >>> [round(float(obs.calculate_qparams(method=m)[0]), 5) for m in HISTOGRAM_METHODS]
    [0.03406, 0.03406, 0.03217, 0.02935, 0.03261]
"""

from __future__ import annotations

from typing import Any

import torch

from qviz.engine.observers.base import check_bool, check_int
from qviz.engine.observers.binning import histc, rebin
from qviz.engine.observers.l2_search import l2_search
from qviz.engine.observers.uniform import UniformQuantizationObserverBase
from qviz.engine.qparams import MAX_NUM_BITS, bits_of_range
from qviz.engine.tensor.calib import CalibMethod, HistogramCalibrator
from qviz.errors import CalibrationError, ConfigError

#: The ways a HistogramObserver can pick its range.
HISTOGRAM_METHODS = ("l2", *(m.value for m in CalibMethod))
_AMAX_OPTIONS = ("percentile", "start_bin", "stride")


def parse_histogram_method(value: Any) -> str:
    """The method name (``"l2"`` or a :class:`~qviz.engine.tensor.calib.CalibMethod` value).

    Example:
        >>> parse_histogram_method("Entropy"), parse_histogram_method("l2")
        ('entropy', 'l2')
        >>> parse_histogram_method("kl")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: unknown HistogramObserver method 'kl': use one of 'l2', 'max', \
'percentile', 'entropy', 'mse'
    """
    if isinstance(value, str) and value.lower() == "l2":
        return "l2"
    try:
        return CalibMethod.parse(value).value
    except ConfigError:
        valid = ", ".join(repr(m) for m in HISTOGRAM_METHODS)
        raise ConfigError(
            f"unknown HistogramObserver method {value!r}: use one of {valid}"
        ) from None


class HistogramObserver(UniformQuantizationObserverBase):
    """Per-tensor qparams from a running histogram (torch's L2 search, or a calibrator method).

    Args:
        bins: number of histogram bins.
        dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps: see
            :class:`~qviz.engine.observers.uniform.UniformQuantizationObserverBase`;
            ``qscheme`` is per-tensor affine (default) or symmetric.
        is_dynamic: must be False.
        method: ``"l2"`` (torch's search, default), ``"max"``, ``"percentile"``, ``"entropy"`` or
            ``"mse"``; can be changed later through the ``method`` attribute.
        switchable: keep the statistics of every method so ``method`` can change after
            calibration (costs a second histogram per batch, see the module docstring). None
            (the default) keeps only what ``method`` needs.
        percentile: share of ``|x|`` kept unclipped by ``method="percentile"``.

    Attributes:
        histogram: float32 counts, ``bins`` equal bins over ``[min_val, max_val]`` (torch's).
        calibrator: the HistogramCalibrator fed the same batches, or None when not kept.

    Example:
        >>> import torch
        >>> obs = HistogramObserver.with_args(eps=2**-12, dtype=torch.int8)()
        >>> _ = obs(torch.linspace(-1.0, 1.0, 1001))
        >>> obs.calculate_qparams()
        (tensor([0.0078]), tensor([0], dtype=torch.int32))
        >>> obs
        HistogramObserver(int8 per_tensor_affine [-128, 127] bins=2048 method=l2 batches=1 \
min=-1 max=1)
    """

    histogram: torch.Tensor

    def __init__(
        self,
        bins: int = 2048,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_tensor_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        eps: float = torch.finfo(torch.float32).eps,
        is_dynamic: bool = False,
        method: str = "l2",
        switchable: bool | None = None,
        percentile: float = 99.99,
    ) -> None:
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        owner = type(self).__name__
        if self.is_dynamic:
            raise ConfigError(
                f"{owner} does not support dynamic quantization (is_dynamic=True); use "
                f"MovingAverageMinMaxObserver(averaging_constant=1) or PlaceholderObserver"
            )
        if check_int(owner, "bins", bins) < 2:
            raise ConfigError(f"{owner}: bins must be >= 2, got {bins}")
        self.bins = bins
        self.dst_nbins = 2 ** torch.iinfo(self.dtype).bits
        self.upsample_rate = 16  # torch's sub-bins per bin when re-binning onto a wider range
        number = isinstance(percentile, int | float) and not isinstance(percentile, bool)
        if not (number and 0 < percentile <= 100):
            raise ConfigError(f"{owner}: percentile must be in (0, 100], got {percentile!r}")
        self.percentile = float(percentile)
        self._method = parse_histogram_method(method)
        self.calibrator = self._make_calibrator(switchable)
        self.switchable = self.calibrator is not None and (switchable is not False)
        self.register_buffer("histogram", torch.zeros(bins, device=self._device))
        self.register_buffer("min_val", torch.tensor(float("inf"), device=self._device))
        self.register_buffer("max_val", torch.tensor(float("-inf"), device=self._device))

    def _make_calibrator(self, switchable: bool | None) -> HistogramCalibrator | None:
        owner = type(self).__name__
        if switchable is not None:
            check_bool(owner, "switchable", switchable)
        num_bits = bits_of_range(self.quant_min, self.quant_max)
        supported = 2 <= num_bits <= MAX_NUM_BITS
        needed = self._method != "l2" or bool(switchable)
        if needed and not supported:
            raise ConfigError(
                f"{owner}: method={self._method!r} and switchable=True need a range of 2 to "
                f"{MAX_NUM_BITS} bits, got [{self.quant_min}, {self.quant_max}]; use method='l2' "
                f"and switchable=False"
            )
        if not needed:  # by default keep only what the method needs (see the module docstring)
            return None
        return HistogramCalibrator(num_bits, num_bins=self.bins, name=owner)

    @property
    def method(self) -> str:
        """How ``calculate_qparams()`` picks the range; settable after calibration.

        Example:
            >>> obs = HistogramObserver(switchable=True)
            >>> obs.method = "percentile"; obs.method
            'percentile'
        """
        return self._method

    @method.setter
    def method(self, value: str) -> None:
        self._method = self._available(parse_histogram_method(value))

    def _available(self, method: str) -> str:
        if method == "l2" and not self._keeps_l2:
            raise ConfigError(
                f"{self._label()} kept no L2 histogram (switchable=False, method="
                f"{self._method!r}); create it with switchable=True to use method='l2'"
            )
        if method != "l2" and self.calibrator is None:
            raise ConfigError(
                f"{self._label()} kept no |x| histogram for method={method!r} "
                f"(switchable=False, method='l2'); create it with switchable=True or "
                f"method={method!r}"
            )
        return method

    @property
    def _keeps_l2(self) -> bool:
        return self.switchable or self._method == "l2"

    @torch.no_grad()
    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Add ``x_orig`` to the histogram(s); return it unchanged."""
        x = self._input(x_orig)
        if x is None:
            return x_orig
        if not x.is_floating_point():
            x = x.to(torch.float32)
        x_min, x_max = torch.aminmax(x)
        self._check_finite(x, x_min, x_max)
        self._follow(x_min.device)
        if self._keeps_l2:
            self._add_to_histogram(x, x_min, x_max)
        else:
            self.min_val.copy_(torch.min(self.min_val, x_min))
            self.max_val.copy_(torch.max(self.max_val, x_max))
        if self.calibrator is not None:
            self.calibrator.collect(x)
        self._count(x)
        return x_orig

    def _add_to_histogram(self, x: torch.Tensor, x_min: torch.Tensor, x_max: torch.Tensor) -> None:
        """torch's update: same range -> add counts; wider range -> re-bin the old ones first."""
        if not self._has_range():
            self.min_val.copy_(x_min)
            self.max_val.copy_(x_max)
            self.histogram.copy_(histc(x, self.bins, x_min, x_max))
            return
        old_min, old_max = self.min_val, self.max_val
        new_min, new_max = torch.min(old_min, x_min), torch.max(old_max, x_max)
        counts = histc(x, self.bins, new_min, new_max).to(self.histogram.device)
        if new_min.item() == old_min.item() and new_max.item() == old_max.item():
            self.histogram.add_(counts)
            return
        self.histogram.copy_(counts + self.histogram_on(new_min, new_max))
        self.min_val.copy_(new_min)
        self.max_val.copy_(new_max)

    def histogram_on(self, new_min: torch.Tensor, new_max: torch.Tensor) -> torch.Tensor:
        """The histogram re-binned onto the wider range ``[new_min, new_max]`` as torch does when
        a batch widens the range (the merge of several processes' histograms uses it too).

        Example:
            >>> obs = HistogramObserver(bins=4)
            >>> _ = obs(torch.tensor([0.0, 1.0, 2.0, 4.0]))
            >>> obs.histogram_on(torch.tensor(0.0), torch.tensor(8.0)).tolist()
            [2.0, 2.0, 0.0, 0.0]
        """
        old_min, old_max = self.min_val, self.max_val
        new_min = new_min.to(old_min.device, old_min.dtype)
        new_max = new_max.to(old_max.device, old_max.dtype)
        if new_min.item() == old_min.item() and new_max.item() == old_max.item():
            return self.histogram.clone()
        if old_min.item() == old_max.item():  # earlier values were all one number: move it whole
            moved = torch.histc(old_min, self.bins, min=new_min, max=new_max)
            return moved * torch.sum(self.histogram)
        return rebin(self.histogram, old_min, old_max, new_min, new_max, self.upsample_rate)

    def _reset_statistics(self) -> None:
        super()._reset_statistics()
        self.histogram.zero_()
        if self.calibrator is not None:
            self.calibrator.reset()

    def calculate_qparams(
        self, method: str | None = None, **amax_kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)``, each of shape ``(1,)``.

        Args:
            method: override ``self.method`` for this call (the observer is not changed).
            **amax_kwargs: ``percentile``, ``start_bin`` or ``stride`` for the calibrator's
                :meth:`~qviz.engine.tensor.calib.HistogramCalibrator.compute_amax`.

        Raises:
            CalibrationError: nothing was observed yet.
            ConfigError: an unknown method or option, or a method whose statistics this
                observer did not keep (``switchable=False``).
        """
        chosen = self._available(self._method if method is None else parse_histogram_method(method))
        unknown = set(amax_kwargs) - set(_AMAX_OPTIONS)
        if unknown or (amax_kwargs and chosen == "l2"):
            raise ConfigError(
                f"{self._label()}.calculate_qparams: options {sorted(amax_kwargs)} do not apply to "
                f"method={chosen!r}; the calibrator methods take {', '.join(_AMAX_OPTIONS)}"
            )
        if not self._has_range():
            raise self._no_data_error()
        if chosen == "l2":
            return self._l2_qparams()
        amax = self._amax(chosen, amax_kwargs)
        if self.is_symmetric:
            return self._calculate_qparams(-amax, amax)
        return self._calculate_qparams(
            torch.max(self.min_val, -amax), torch.min(self.max_val, amax)
        )

    def _l2_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        hist = self.histogram.detach().to("cpu")
        start, end = self._l2_range(hist, float(self.min_val), float(self.max_val))
        bin_width = (self.max_val - self.min_val) / self.bins
        low = self.min_val + bin_width * start
        high = self.min_val + bin_width * (end + 1)
        return self._calculate_qparams(low, high)

    def _l2_range(self, hist: torch.Tensor, low: float, high: float) -> tuple[int, int]:
        """:func:`l2_search`'s bins for these statistics, remembered with them: the search is a
        pure function of its arguments, so an observer asked again for unchanged statistics (a
        copy of a calibrated one, as ``ObserverReuse`` makes for every variant) gets the same
        answer without searching again."""
        memo = getattr(self, "_l2_memo", None)
        if memo is not None:
            (m_hist, m_low, m_high, m_bins), found = memo
            if (m_low, m_high, m_bins) == (low, high, self.dst_nbins) and torch.equal(m_hist, hist):
                return found
        found = l2_search(hist, low, high, self.dst_nbins)
        self._l2_memo = ((hist.clone(), low, high, self.dst_nbins), found)
        return found

    def _amax(self, method: str, amax_kwargs: dict[str, Any]) -> torch.Tensor:
        if self.calibrator is None or self.calibrator.num_batches == 0:
            raise CalibrationError(
                f"{self._label()} has no |x| histogram for method={method!r} (it was not fed, or "
                f"the observer was loaded from a state_dict); run calibration batches again"
            )
        if method == "percentile":
            amax_kwargs = {"percentile": self.percentile, **amax_kwargs}
        amax = self.calibrator.compute_amax(method, **amax_kwargs)
        return amax.to(self.min_val.device, torch.float32)

    def extra_repr(self) -> str:
        return f"{self._config_repr()} bins={self.bins} method={self._method} {self._range_repr()}"
