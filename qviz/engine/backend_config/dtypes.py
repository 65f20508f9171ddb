"""What a backend runs quantized, per pattern: dtypes, their constraints, how outputs are observed.

The vocabulary of PyTorch's BackendConfig, with the same names and arguments:

* :class:`ObservationType`: whether a pattern's output gets its own observer, shares its
  input's (``max_pool2d``, ``cat``: the output grid is the input grid), or is not observed;
* :class:`DTypeWithConstraints`: a dtype plus bounds the user's observer must respect
  (``quant_min_lower_bound``, ``quant_max_upper_bound``, ``scale_min_lower_bound``, ...);
* :class:`DTypeConfig`: the dtypes of a pattern's input, output, weight and bias.

Example:
    >>> import torch
    >>> act = DTypeWithConstraints(dtype=torch.quint8, quant_min_lower_bound=0,
    ...                            quant_max_upper_bound=255, scale_min_lower_bound=2**-12)
    >>> config = DTypeConfig(input_dtype=act, output_dtype=act, weight_dtype=torch.qint8,
    ...                      bias_dtype=torch.float)
    >>> config.input_dtype, config.weight_dtype
    (torch.quint8, torch.qint8)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from qviz.errors import ConfigError


class ObservationType(enum.Enum):
    """How the output of a pattern is observed, relative to its input."""

    #: The output gets an observer of its own (conv, linear, add).
    OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT = 0
    #: The output shares the input's observer (max_pool2d, flatten, cat): same qparams.
    OUTPUT_SHARE_OBSERVER_WITH_INPUT = 1
    #: Neither input nor output is observed (ops a backend runs on any dtype unchanged).
    INPUT_OUTPUT_NOT_OBSERVED = 2

    @classmethod
    def of(cls, value: Any) -> ObservationType:
        """qviz's member for ``value``: itself, torch.ao's member of the same name, or the name.

        Raises:
            ConfigError: ``value`` names no observation type (the message lists them).
        """
        if isinstance(value, cls):
            return value
        name = getattr(value, "name", value)
        if isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise ConfigError(
            f"set_observation_type: {value!r} is not an ObservationType; use one of "
            f"{', '.join(f'ObservationType.{m}' for m in cls.__members__)}"
        )


def _check_dtype(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, torch.dtype):
        raise ConfigError(f"{where} must be a torch.dtype or None, got {value!r}")


_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_SUB_BYTE = tuple(
    d for n in ("uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1", "int2",
                "int3", "int4", "int5", "int6", "int7")
    if isinstance(d := getattr(torch, n, None), torch.dtype)
)  # fmt: skip
#: What an activation or a weight can be quantized to (or left in, for the floats).
TENSOR_DTYPES = (
    torch.quint8, torch.qint8, torch.uint8, torch.int8, torch.uint16, torch.int16,
    torch.quint4x2, torch.quint2x4, torch.float8_e5m2, torch.float8_e4m3fn, *_SUB_BYTE, *_FLOATS,
)  # fmt: skip
#: A bias stays float, or is a 32-bit integer on the grid input_scale * weight_scale.
BIAS_DTYPES = (*_FLOATS, torch.int32, torch.qint32)


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "")


def _check_role_dtype(value: torch.dtype | None, role: str) -> None:
    """A dtype a quantized tensor of ``role`` can have, or a ConfigError naming the choices."""
    if value is None or value in TENSOR_DTYPES:
        return
    why = (
        "a 32-bit integer is a bias / accumulator dtype (bias_dtype=torch.qint32)"
        if value in (torch.int32, torch.qint32)
        else "no observer quantizes to it"
    )
    raise ConfigError(
        f"DTypeConfig({role}={value}): {why}; give torch.quint8 / torch.qint8 (or uint8, int8, "
        f"int16, uint16, quint4x2, float8), a float dtype (torch.float: not quantized), or None"
    )


def _check_number(value: Any, field: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"DTypeWithConstraints({field}={value!r}): give a number or None")


@dataclass(frozen=True)
class DTypeWithConstraints:
    """A dtype and the limits a user's observer must stay within for the backend to run it.

    Args:
        dtype: the quantized dtype (``torch.quint8``, ``torch.qint8``, ``torch.float16``...).
        quant_min_lower_bound, quant_max_upper_bound: the observer's ``quant_min`` must be at
            least the first, its ``quant_max`` at most the second.
        scale_min_lower_bound: the smallest scale the backend accepts; the observer's ``eps``
            (its smallest scale) must not be below it.
        scale_max_upper_bound: the largest scale the backend accepts (recorded; like the
            reference, not checked against observers, whose scale is known only after
            calibration).
        scale_exact_match, zero_point_exact_match: fixed qparams the backend requires
            (sigmoid, tanh); the observer must be a fixed-qparams observer with these values.

    Example:
        >>> DTypeWithConstraints(dtype=torch.qint8,
        ...     quant_min_lower_bound=-127).quant_min_lower_bound
        -127
    """

    dtype: torch.dtype | None = None
    quant_min_lower_bound: int | float | None = None
    quant_max_upper_bound: int | float | None = None
    scale_min_lower_bound: int | float | None = None
    scale_max_upper_bound: int | float | None = None
    scale_exact_match: float | None = None
    zero_point_exact_match: int | None = None

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, "DTypeWithConstraints(dtype=...)")
        for field in (
            "quant_min_lower_bound", "quant_max_upper_bound", "scale_min_lower_bound",
            "scale_max_upper_bound", "scale_exact_match", "zero_point_exact_match",
        ):  # fmt: skip
            _check_number(getattr(self, field), field)
        if (self.scale_exact_match is None) != (self.zero_point_exact_match is None):
            raise ConfigError(
                f"DTypeWithConstraints: scale_exact_match={self.scale_exact_match} and "
                f"zero_point_exact_match={self.zero_point_exact_match}: fixed qparams need both "
                f"(e.g. 1/256 and 0 for sigmoid on quint8)"
            )
        if self.scale_exact_match is not None and not self.scale_exact_match > 0:
            raise ConfigError(
                f"DTypeWithConstraints: scale_exact_match must be > 0, got {self.scale_exact_match}"
            )
        low, high = self.quant_min_lower_bound, self.quant_max_upper_bound
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"DTypeWithConstraints: quant_min_lower_bound={low} is above "
                f"quant_max_upper_bound={high}"
            )
        if self.scale_min_lower_bound is not None and self.scale_min_lower_bound < 0:
            raise ConfigError(
                f"DTypeWithConstraints: scale_min_lower_bound must be >= 0, got "
                f"{self.scale_min_lower_bound}"
            )

    @classmethod
    def of(cls, value: Any, where: str) -> DTypeWithConstraints:
        """A dtype, None, or a DTypeWithConstraints (qviz's or torch.ao's) as qviz's."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, torch.dtype):
            return cls(dtype=value)
        if hasattr(value, "dtype") and hasattr(value, "quant_min_lower_bound"):
            fields = cls.__dataclass_fields__
            return cls(**{f: getattr(value, f) for f in fields if hasattr(value, f)})
        raise ConfigError(
            f"{where} must be a torch.dtype, DTypeWithConstraints or None, got {value!r}"
        )

    def describe(self) -> str:
        """``quint8 [0, 255] scale >= 0.000244``: the dtype and its constraints, briefly."""
        text = str(self.dtype).replace("torch.", "")
        if self.quant_min_lower_bound is not None or self.quant_max_upper_bound is not None:
            text += f" [{self.quant_min_lower_bound}, {self.quant_max_upper_bound}]"
        if self.scale_min_lower_bound is not None:
            text += f" scale >= {self.scale_min_lower_bound:.3g}"
        if self.scale_exact_match is not None:
            text += f" fixed scale={self.scale_exact_match:.6g} zp={self.zero_point_exact_match}"
        return text


class DTypeConfig:
    """The dtypes a backend runs a pattern with: input, output, weight, bias, dynamic or not.

    Args:
        input_dtype, output_dtype, weight_dtype: a ``torch.dtype``, a
            :class:`DTypeWithConstraints`, or None (that tensor is not quantized).
        bias_dtype: the bias dtype (``torch.float`` for float bias), or None.
        is_dynamic: the input's qparams are computed at run time.

    Raises:
        ConfigError: a dtype that is not a torch.dtype, or none a tensor of that role can have
            (``torch.bool``; a 32-bit integer outside ``bias_dtype``); a quantized bias without
            a quantized weight and input, a bias dtype other than a float or a 32-bit integer;
            ``is_dynamic`` not a bool; no dtype given at all.

    Example:
        >>> DTypeConfig(input_dtype=torch.quint8, output_dtype=torch.quint8).output_dtype
        torch.quint8
    """

    def __init__(
        self,
        input_dtype: torch.dtype | DTypeWithConstraints | None = None,
        output_dtype: torch.dtype | DTypeWithConstraints | None = None,
        weight_dtype: torch.dtype | DTypeWithConstraints | None = None,
        bias_dtype: torch.dtype | None = None,
        is_dynamic: bool | None = None,
    ) -> None:
        self.input_dtype_with_constraints = DTypeWithConstraints.of(input_dtype, "input_dtype")
        self.output_dtype_with_constraints = DTypeWithConstraints.of(output_dtype, "output_dtype")
        self.weight_dtype_with_constraints = DTypeWithConstraints.of(weight_dtype, "weight_dtype")
        _check_dtype(bias_dtype, "DTypeConfig(bias_dtype=...)")
        self.bias_dtype = bias_dtype
        if is_dynamic is not None and not isinstance(is_dynamic, bool):
            raise ConfigError(
                f"DTypeConfig(is_dynamic={is_dynamic!r}): give True (qparams computed at run "
                f"time), False or None"
            )
        self.is_dynamic = is_dynamic
        if input_dtype is None and output_dtype is None and weight_dtype is None:
            raise ConfigError(
                "DTypeConfig() names no dtype: give at least input_dtype (e.g. "
                "DTypeConfig(input_dtype=torch.quint8, output_dtype=torch.quint8))"
            )
        for role in ("input_dtype", "output_dtype", "weight_dtype"):
            _check_role_dtype(getattr(self, role), role)
        self._check_bias()

    def _check_bias(self) -> None:
        bias = self.bias_dtype
        if bias is None or bias in _FLOATS:
            return
        if bias not in BIAS_DTYPES:
            raise ConfigError(
                f"DTypeConfig(bias_dtype={bias}): a bias stays float (torch.float) or is a "
                f"32-bit integer (torch.qint32 / torch.int32) on the grid input_scale * "
                f"weight_scale; {_name(bias)} is neither"
            )
        unquantized = [
            f"{role}={_name(getattr(self, role))}"
            for role in ("weight_dtype", "input_dtype")
            if getattr(self, role) is None or getattr(self, role) in _FLOATS
        ]
        if unquantized:
            raise ConfigError(
                f"DTypeConfig(bias_dtype={bias}, {', '.join(unquantized)}): a quantized bias "
                f"takes its scale from the input's and the weight's, so both must be quantized; "
                f"give a quantized weight_dtype / input_dtype (torch.qint8 / torch.quint8), or "
                f"bias_dtype=torch.float"
            )

    @property
    def input_dtype(self) -> torch.dtype | None:
        return self.input_dtype_with_constraints.dtype

    @property
    def output_dtype(self) -> torch.dtype | None:
        return self.output_dtype_with_constraints.dtype

    @property
    def weight_dtype(self) -> torch.dtype | None:
        return self.weight_dtype_with_constraints.dtype

    @classmethod
    def of(cls, value: Any) -> DTypeConfig:
        """qviz's DTypeConfig for ``value`` (itself, or torch.ao's DTypeConfig)."""
        if isinstance(value, cls):
            return value
        if hasattr(value, "input_dtype_with_constraints"):
            return cls(
                DTypeWithConstraints.of(value.input_dtype_with_constraints, "input_dtype"),
                DTypeWithConstraints.of(value.output_dtype_with_constraints, "output_dtype"),
                DTypeWithConstraints.of(value.weight_dtype_with_constraints, "weight_dtype"),
                value.bias_dtype,
                value.is_dynamic,
            )
        raise ConfigError(f"add_dtype_config: {value!r} is not a DTypeConfig")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DTypeConfig) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in vars(self).items())))

    def __repr__(self) -> str:
        parts = [
            f"{role}={c.describe()}"
            for role, c in (
                ("input", self.input_dtype_with_constraints),
                ("output", self.output_dtype_with_constraints),
                ("weight", self.weight_dtype_with_constraints),
            )
            if c.dtype is not None
        ]
        if self.bias_dtype is not None:
            parts.append(f"bias={str(self.bias_dtype).replace('torch.', '')}")
        if self.is_dynamic:
            parts.append("dynamic")
        return f"DTypeConfig({', '.join(parts)})"
