"""TensorQuantizer: the nn.Module that calibrates and (fake-)quantizes one tensor.

Example:
    >>> import torch
    >>> from qviz.engine.tensor.descriptor import QuantDescriptor
    >>> tq = TensorQuantizer(QuantDescriptor(calib_method="percentile"))
    >>> tq.disable_quant(); tq.enable_calib()
    >>> _ = tq(torch.linspace(-1, 1, 2001))          # calibration pass: values flow through
    >>> tq.load_calib_amax(percentile=99.9)
    >>> tq.disable_calib(); tq.enable_quant()
    >>> tq
    TensorQuantizer(8bit fake per-tensor amax=0.9990 calibrator=HistogramCalibrator quant)
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator

import torch
from torch import nn

from qviz.engine.compat import traced_meta
from qviz.engine.tensor.calib import CalibMethod, Calibrator, HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_PER_TENSOR,
    QuantDescriptor,
    check_amax,
    short_amax,
)
from qviz.engine.tensor.fake_quant import (
    FakeTensorQuantFunction,
    TensorQuantFunction,
    torch_fake_quant,
)
from qviz.errors import ConfigError, QuantizationError, QvizError

#: Under ``torch.export`` every node a quantizing TensorQuantizer becomes carries
#: ``node.meta["custom"][EXPORT_META_KEY]``: its :meth:`TensorQuantizer.facts`.
EXPORT_META_KEY = "qviz_tensor_quantizer"


def _fitting_axis(shape: tuple[int, ...]) -> str:
    """The ``axis=`` a quantizer needs for an amax of ``shape`` (its dims longer than 1)."""
    kept = tuple(d for d, n in enumerate(shape) if n > 1)
    return "None" if not kept else str(kept[0]) if len(kept) == 1 else str(kept)


def _amax_shape_problem(amax: torch.Tensor, axis: tuple[int, ...] | None) -> str | None:
    """Why ``amax`` does not fit a quantizer with ``axis`` (None: it fits).

    Per tensor, amax is one value (any shape of one element). Per channel, it is shaped to
    broadcast against the input, as a calibrator computes it (``(C, 1, 1, 1)`` for ``axis=0``
    on a conv weight): the kept axes exist and every other dim is 1; a 0-d amax (one value
    for every channel) fits as well.
    """
    shape = tuple(amax.shape)
    if axis is None:
        if amax.numel() == 1:
            return None
        return f"one value, got {amax.numel()} values of shape {shape}"
    if amax.dim() == 0:
        return None
    expected = f"one amax per index of axis {axis}, shaped to broadcast (e.g. (C, 1, 1, 1))"
    if any(not -amax.dim() <= a < amax.dim() for a in axis):
        return f"{expected}, got shape {shape}, which has no axis {axis}"
    keep = {a % amax.dim() for a in axis}
    if any(n != 1 for d, n in enumerate(shape) if d not in keep):
        return f"{expected}, got shape {shape}, which is longer than 1 on other axes"
    return None


def _make_calibrator(desc: QuantDescriptor) -> Calibrator:
    common = {"name": desc.name, "skip_nonfinite": desc.skip_nonfinite}
    if desc.calib_method == CalibMethod.MAX.value:
        return MaxCalibrator(desc.num_bits, desc.axis, desc.unsigned, **common)
    return HistogramCalibrator(desc.num_bits, desc.axis, desc.unsigned, desc.num_bins, **common)


class TensorQuantizer(nn.Module):
    """Calibrate and quantize a tensor as a :class:`QuantDescriptor` says.

    In calibration mode (``enable_calib()``) every forward feeds the calibrator; in quant mode
    (``enable_quant()``, the default) the input is (fake-)quantized with the loaded amax, or with
    an amax computed from the input itself when none is loaded ("dynamic"). ``disable()`` turns
    it into the identity.

    Args:
        quant_desc: how to quantize (bits, axis, calibration method, ...).
        disabled: start as the identity.
        if_quant: start in quant mode.
        if_calib: start in calibration mode.

    ``use_fb_fake_quant`` (a class attribute, False by default; an instance attribute
    overrides it) routes fake quantization through torch's ``fake_quantize_per_tensor_affine``
    / ``fake_quantize_per_channel_affine`` (:func:`qviz.engine.tensor.fake_quant.torch_fake_quant`):
    the same integer grid, the operators ONNX export turns into QuantizeLinear /
    DequantizeLinear. :func:`fb_fake_quant` switches it on for a block.

    Under ``torch.export`` the nodes a quantizing forward becomes carry its :meth:`facts` in
    ``node.meta["custom"][EXPORT_META_KEY]`` (with the module path in ``nn_module_stack``), so
    :mod:`qviz.engine.tensor.records` can say what each exported quantizer is.

    Example:
        >>> import torch
        >>> from qviz.engine.tensor.descriptor import QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL
        >>> w = torch.randn(4, 2, 3, 3)
        >>> tq = TensorQuantizer(QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL)
        >>> tq(w).shape, tq.axis
        (torch.Size([4, 2, 3, 3]), (0,))
    """

    #: route fake quantization through torch's fake_quantize ops (see the class docstring)
    use_fb_fake_quant: bool = False

    def __init__(
        self,
        quant_desc: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR,
        disabled: bool = False,
        if_quant: bool = True,
        if_calib: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(quant_desc, QuantDescriptor):
            raise ConfigError(
                f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}"
            )
        self.quant_desc = quant_desc
        self.name = quant_desc.name
        self._disabled = bool(disabled)
        self._if_quant = bool(if_quant)
        self._if_calib = bool(if_calib)
        self._scale: torch.Tensor | None = None
        self._amax_method: str | None = None
        self._calibrator = _make_calibrator(quant_desc)
        amax = None
        if quant_desc.amax is not None:
            fix = "give the descriptor an amax shaped for its axis, or amax=None to calibrate"
            amax = self._checked_amax(quant_desc.amax, self._label(), fix)
        self.register_buffer("_amax", amax)

    # -- descriptor views -----------------------------------------------------------------------
    @property
    def num_bits(self) -> int:
        return self.quant_desc.num_bits

    @property
    def unsigned(self) -> bool:
        return self.quant_desc.unsigned

    @property
    def narrow_range(self) -> bool:
        return self.quant_desc.narrow_range

    @property
    def fake_quant(self) -> bool:
        return self.quant_desc.fake_quant

    @property
    def axis(self) -> tuple[int, ...] | None:
        return self.quant_desc.axis

    @property
    def calibrator(self) -> Calibrator:
        return self._calibrator

    @property
    def scale(self) -> torch.Tensor | None:
        """The multiplier of the last integer (``fake_quant=False``) forward, else None."""
        return self._scale

    # -- amax -----------------------------------------------------------------------------------
    @property
    def amax(self) -> torch.Tensor | None:
        """The loaded amax (None: computed from each input on the fly)."""
        return self._amax

    @property
    def amax_method(self) -> str | None:
        """The method :meth:`load_calib_amax` computed the loaded amax with (``"entropy"``,
        ``"percentile 99.9"``); None when amax was set by hand, loaded from a state_dict, or
        never loaded."""
        return getattr(self, "_amax_method", None)  # absent in modules pickled before it existed

    @amax.setter
    def amax(self, value: float | torch.Tensor | None) -> None:
        if value is None:
            self._amax_method = None
            self._amax = None
            return
        fix = "set a finite amax >= 0 shaped for the axis, or None to compute it from each input"
        value = self._checked_amax(value, self._label(), fix)
        if self._amax is not None:
            value = value.to(self._amax.device)
        self._amax_method = None
        self._amax = value

    def _checked_amax(self, value: object, where: str, fix: str) -> torch.Tensor:
        """``value`` as an amax for this quantizer: finite, >= 0 and fitting its axis setting.

        The one check every way of setting amax goes through (the setter, ``load_calib_amax``,
        ``load_state_dict``).
        """
        amax = check_amax(value, where, fix)
        problem = _amax_shape_problem(amax, self.axis)
        if problem is not None:
            setting = "per-tensor (axis=None)" if self.axis is None else f"axis={self.axis}"
            raise ConfigError(
                f"{where} is {setting}, so its amax must be {problem}; build the quantizer "
                f"with QuantDescriptor(axis={_fitting_axis(tuple(amax.shape))}, ...) to match it, "
                f"or {fix}"
            )
        return amax

    def load_calib_amax(self, method: CalibMethod | str | None = None, **kwargs) -> None:
        """Compute amax from what the calibrator collected and load it.

        Args:
            method: ``"max"``, ``"percentile"``, ``"entropy"`` or ``"mse"``; defaults to the
                descriptor's ``calib_method``.
            **kwargs: options of the method (``percentile=``, ``start_bin=``, ``stride=``).

        Raises:
            CalibrationError: the calibrator has seen no data.
        """
        method = method if method is not None else self.quant_desc.default_method
        if method is None:
            valid = ", ".join(repr(m.value) for m in CalibMethod)
            raise ConfigError(
                f"{self._label()} was described with calib_method='histogram', which has no "
                f"default "
                f"amax method: call load_calib_amax(method=...) with one of {valid}"
            )
        self._check_method_options(method, kwargs)
        try:
            self.amax = self._calibrator.compute_amax(method, **kwargs)
        except QvizError as exc:
            raise type(exc)(f"{self._label()}: {exc}") from exc
        chosen = CalibMethod.parse(method).value
        if chosen == CalibMethod.PERCENTILE.value and "percentile" in kwargs:
            chosen = f"{chosen} {float(kwargs['percentile']):g}"
        self._amax_method = chosen

    def _check_method_options(self, method: CalibMethod | str, kwargs: dict) -> None:
        """Refuse options the calibrator's ``compute_amax`` does not take, naming those it does."""
        signature = inspect.signature(self._calibrator.compute_amax)
        try:
            signature.bind(method, **kwargs)
        except TypeError:
            options = [p for p in signature.parameters if p != "method"]
            raise ConfigError(
                f"{self._label()}: load_calib_amax got options {sorted(kwargs)}, but its "
                f"{type(self._calibrator).__name__} takes {options or 'none'}: pass only those "
                f"(e.g. percentile=99.9 with method='percentile')"
            ) from None

    def set_calib_method(self, method: CalibMethod | str) -> None:
        """Collect for ``method`` from now on: a max-only quantizer gets a HistogramCalibrator
        (same bits, axis and sign) for ``"percentile"`` / ``"entropy"`` / ``"mse"``, and the
        descriptor records the method. What was collected before is dropped.

        Example:
            >>> tq = TensorQuantizer()
            >>> tq.set_calib_method("entropy")
            >>> type(tq.calibrator).__name__, tq.quant_desc.calib_method
            ('HistogramCalibrator', 'entropy')
        """
        method = CalibMethod.parse(method)
        self.quant_desc = dataclasses.replace(self.quant_desc, calib_method=method.value)
        if isinstance(self._calibrator, HistogramCalibrator) or method is CalibMethod.MAX:
            self._calibrator.reset()
            return
        self._calibrator = _make_calibrator(self.quant_desc)

    # -- modes ----------------------------------------------------------------------------------
    def enable(self) -> None:
        self._disabled = False

    def disable(self) -> None:
        self._disabled = True

    def enable_quant(self) -> None:
        self._if_quant = True

    def disable_quant(self) -> None:
        self._if_quant = False

    def enable_calib(self) -> None:
        self._if_calib = True

    def disable_calib(self) -> None:
        self._if_calib = False

    def facts(self) -> dict[str, object]:
        """What this quantizer is, as plain data (what an export records on its nodes).

        Keys: ``num_bits``, ``unsigned``, ``narrow_range``, ``axis`` (a list or None),
        ``fake_quant``, ``calib_method`` (the descriptor's), ``amax_method`` (see
        :attr:`amax_method`), ``calibrator`` (its class name), ``dynamic`` (no amax loaded),
        ``scale_amax``, ``disabled``, ``quant``, ``calib`` (the modes).

        Example:
            >>> f = TensorQuantizer().facts()
            >>> f["num_bits"], f["dynamic"], f["calibrator"]
            (8, True, 'MaxCalibrator')
        """
        d = self.quant_desc
        return {
            "num_bits": d.num_bits, "unsigned": d.unsigned, "narrow_range": d.narrow_range,
            "axis": None if d.axis is None else list(d.axis), "fake_quant": d.fake_quant,
            "calib_method": d.calib_method, "amax_method": self.amax_method,
            "calibrator": type(self._calibrator).__name__, "dynamic": self._amax is None,
            "scale_amax": d.scale_amax, "disabled": self._disabled, "quant": self._if_quant,
            "calib": self._if_calib,
        }  # fmt: skip

    # -- forward --------------------------------------------------------------------------------
    def _check_input(self, inputs: torch.Tensor) -> None:
        """The input has the axes this quantizer keeps, and its loaded amax has the input's
        dims (a per-channel amax of another rank would broadcast along the wrong axes)."""
        dims = inputs.dim()
        bad = [a for a in self.axis or () if not -dims <= a < dims]
        if bad:
            raise ConfigError(
                f"axis={self.axis}, but the input has {dims} dims {tuple(inputs.shape)}: "
                f"describe the quantizer with axes in range(-{dims}, {dims}) "
                f"(QuantDescriptor(axis=...))"
            )
        amax = self._amax
        if amax is not None and self.axis is not None and amax.dim() not in (0, dims):
            raise QuantizationError(
                f"amax of shape {tuple(amax.shape)} has {amax.dim()} dims, the input "
                f"{tuple(inputs.shape)} has {dims}: a per-channel amax has the input's dims, size "
                f"1 on the reduced ones; recalibrate, or set amax shaped for this input"
            )
        if amax is None and inputs.numel() == 0 and not torch.compiler.is_exporting():
            raise QuantizationError(
                f"got an empty tensor of shape {tuple(inputs.shape)}, which has no values to "
                f"compute a dynamic amax from: load an amax (calibrate, or give the descriptor "
                f"amax=), or skip empty batches"
            )

    def _current_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        self._check_input(inputs)
        if self._amax is not None:
            # one value per tensor: 0-d, so a (1, 1, 1, 1) checkpoint amax adds no dims
            amax = self._amax.reshape(()) if self.axis is None else self._amax
        elif self.axis is None:
            amax = inputs.detach().abs().amax().float()
        else:
            keep = {a % inputs.dim() for a in self.axis}
            reduce = [d for d in range(inputs.dim()) if d not in keep]
            amax = inputs.detach().abs().amax(dim=reduce, keepdim=True).float()
        if self.quant_desc.scale_amax is not None:
            amax = amax * self.quant_desc.scale_amax
        return amax

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._disabled:
            return inputs
        try:
            if self._if_calib:
                self._calibrator.collect(inputs)
            if not self._if_quant:
                return inputs
            if torch.compiler.is_exporting():  # the exported nodes say what they quantize
                with traced_meta(EXPORT_META_KEY, self.facts()):
                    return self._quantize(inputs)
            return self._quantize(inputs)
        except QvizError as exc:
            raise type(exc)(f"{self._label()}: {exc}") from exc

    def _quantize(self, inputs: torch.Tensor) -> torch.Tensor:
        amax = self._current_amax(inputs)
        d = self.quant_desc
        # qviz's own arithmetic has data-dependent checks that torch.export cannot trace:
        # an export takes torch's fake_quantize arithmetic, spelled out unless the fb ops
        # are asked for (ONNX), as those have no kernel for symbolic shapes
        if d.fake_quant and (self.use_fb_fake_quant or torch.compiler.is_exporting()):
            return torch_fake_quant(
                inputs, amax, d.num_bits, d.unsigned, d.narrow_range, self.axis,
                torch_ops=self.use_fb_fake_quant,
            )  # fmt: skip
        if d.fake_quant:
            return FakeTensorQuantFunction.apply(
                inputs, amax, d.num_bits, d.unsigned, d.narrow_range
            )
        outputs, self._scale = TensorQuantFunction.apply(
            inputs, amax, d.num_bits, d.unsigned, d.narrow_range, None
        )
        return outputs

    # -- plumbing -------------------------------------------------------------------------------
    def _label(self) -> str:
        return f"TensorQuantizer {self.name!r}" if self.name else "TensorQuantizer"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "_amax"
        if key in state_dict and state_dict[key] is not None:
            saved = self._check_saved_amax(state_dict[key], prefix)
            if self._amax is None:  # a calibrated checkpoint into a fresh module
                self._amax = torch.empty_like(saved, dtype=torch.float32)
            elif self._amax.shape != saved.shape:  # one value either way
                self._amax = torch.empty_like(self._amax).reshape(saved.shape)
            self._amax_method = None  # the checkpoint does not say which method picked it
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_saved_amax(self, saved: object, prefix: str) -> torch.Tensor:
        """Refuse, before anything is copied, a saved amax this quantizer cannot hold."""
        where = f"TensorQuantizer {prefix[:-1]!r}" if prefix else self._label()
        key = prefix + "_amax"
        fix = (
            "recalibrate (calibrate_quantizers / load_calib_amax) or load a checkpoint of a "
            "quantizer built with the same QuantDescriptor"
        )
        if not isinstance(saved, torch.Tensor):
            raise ConfigError(
                f"{where}: checkpoint key {key!r} holds a {type(saved).__name__}, not a tensor; "
                f"{fix}"
            )
        amax = self._checked_amax(saved, f"{where} (checkpoint key {key!r})", fix)
        if self._amax is None or amax.shape == self._amax.shape:
            return saved
        if amax.numel() == self._amax.numel() == 1:
            return saved
        raise ConfigError(
            f"{where}: the checkpoint's amax has shape {tuple(amax.shape)}, this quantizer's "
            f"{tuple(self._amax.shape)} (calibrated for another channel count): load it into a "
            f"layer of the checkpoint's size, or reset the amax first (quantizer.amax = None)"
        )

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        d = self.quant_desc
        s = f"{'unsigned ' if d.unsigned else ''}{d.num_bits}bit"
        s += " narrow" if d.narrow_range else ""
        s += " fake" if d.fake_quant else ""
        s += " fb" if d.fake_quant and self.use_fb_fake_quant else ""
        s += f" axis={d.axis}" if d.axis is not None else " per-tensor"
        s += f" amax={short_amax(self._amax)}"
        s += f" *{d.scale_amax}" if d.scale_amax else ""
        s += f" calibrator={type(self._calibrator).__name__}"
        s += " quant" if self._if_quant else ""
        s += " calib" if self._if_calib else ""
        return s


@contextlib.contextmanager
def fb_fake_quant(model: nn.Module | None = None, enabled: bool = True) -> Iterator[None]:
    """Turn ``use_fb_fake_quant`` on (or off) for the ``with`` block, then restore it.

    With a ``model``, only its TensorQuantizers change (as instance attributes, removed again
    afterwards); without one, the class default changes for every TensorQuantizer.

    Example:
        >>> import torch
        >>> tq = TensorQuantizer()
        >>> with fb_fake_quant(tq):
        ...     tq.use_fb_fake_quant
        True
        >>> tq.use_fb_fake_quant
        False
    """
    if model is None:
        before = TensorQuantizer.__dict__["use_fb_fake_quant"]
        TensorQuantizer.use_fb_fake_quant = enabled
        try:
            yield
        finally:
            TensorQuantizer.use_fb_fake_quant = before
        return
    quantizers = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
    saved = [m.__dict__.get("use_fb_fake_quant") for m in quantizers]
    for m in quantizers:
        m.use_fb_fake_quant = enabled
    try:
        yield
    finally:
        for m, value in zip(quantizers, saved, strict=True):
            if value is None:
                del m.use_fb_fake_quant
            else:
                m.use_fb_fake_quant = value
