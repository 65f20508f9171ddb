"""XNNPACKQuantizer: int8 quantization for XNNPACK (CPU), the patterns torchao's quantizer uses.

Settings, most specific first (a node follows the first that covers it):

1. ``set_module_name(name, config)``: nodes called inside the module ``name`` (the innermost
   configured name wins when names nest);
2. ``set_module_type(type, config)``: nodes inside a module of that class (innermost wins);
3. ``set_operator_type(op, config)``: patterns whose main operator is ``op`` (``F.conv2d``,
   ``torch.add``, ``torch.ops.aten.linear.default``, ...);
4. ``set_global(config)``: everything else.

``config=None`` keeps the covered nodes in float: no pattern that touches them is claimed, and
they do not share quantization with their producer. Every operator node left in float records
why in ``node.meta["qviz_float_reason"]`` / ``["qviz_float_detail"]``.

The patterns and which node gets which spec are listed in
:mod:`qviz.engine.quantizers.annotators`.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Conv2d(2, 2, 1)).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 1, 5, 5),)).module()
    >>> quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> quantizer = quantizer.set_module_name("2", None)      # the last conv stays float
    >>> gm = quantizer.annotate(quantizer.transform_for_annotation(gm))
    >>> nodes = {n.name: n for n in gm.graph.nodes}
    >>> nodes["relu"].meta["quantization_annotation"].output_qspec.dtype
    torch.int8
    >>> nodes["conv2d_1"].meta["qviz_float_reason"], nodes["conv2d_1"].meta["qviz_float_detail"]
    ('filtered by module name', "set_module_name('2', None)")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from qviz.engine.quantizers.annotate import (
    DTYPE_CONSTRAINT,
    FILTERED_BY_MODULE_NAME,
    FILTERED_BY_MODULE_TYPE,
    PATTERN_UNSUPPORTED,
    USER_FALLBACK,
    record_float_reason,
)
from qviz.engine.quantizers.annotators import (
    DYNAMIC_ANNOTATORS,
    SHARE_OPS,
    STATIC_ANNOTATORS,
    propagate_shared,
)
from qviz.engine.quantizers.base import FLOAT_DETAIL_KEY, FLOAT_REASON_KEY, Quantizer
from qviz.engine.quantizers.capabilities import Capability
from qviz.engine.quantizers.config import (  # the doctests below use get_symmetric_...
    check_config,
    config_code,
    get_symmetric_quantization_config,  # noqa: F401
)
from qviz.engine.quantizers.scope import (
    AtenOp,
    OperatorLike,
    Scope,
    check_module_names,
    module_names,
    module_type_names,
    operator_matches,
    qualified_name,
    resolve_operator,
)
from qviz.engine.quantizers.transforms import scalars_to_tensors
from qviz.engine.specs import Q_ANNOTATION_KEY, QuantizationConfig
from qviz.errors import ConfigError


@dataclass(frozen=True)
class _Setting:
    """The setting that governs a node: its kind, key, config and how the user wrote it."""

    kind: str  # "module name", "module type", "operator" or "global"
    key: object
    config: QuantizationConfig | None
    call: str


def _op_label(op: OperatorLike) -> str:
    return str(op) if isinstance(op, AtenOp) else getattr(op, "__name__", None) or repr(op)


class XNNPACKQuantizer(Quantizer):
    """Annotate an exported graph for XNNPACK int8 execution (see the module docstring).

    Example:
        >>> quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> import torch
        >>> _ = quantizer.set_module_type(torch.nn.Linear, None)
        >>> _ = quantizer.set_operator_type(torch.nn.functional.conv2d,
        ...                                 get_symmetric_quantization_config(is_per_channel=True))
        >>> list(quantizer.module_type_config.values())
        [None]
    """

    def __init__(self) -> None:
        self.global_config: QuantizationConfig | None = None
        self.module_name_config: dict[str, QuantizationConfig | None] = {}
        self.module_type_config: dict[type, QuantizationConfig | None] = {}
        self.operator_type_config: dict[OperatorLike, QuantizationConfig | None] = {}
        self._operators: dict[OperatorLike, tuple[AtenOp, ...]] = {}
        self._settings: dict[Node, _Setting] = {}

    def set_global(self, quantization_config: QuantizationConfig | None) -> XNNPACKQuantizer:
        """Config of every node no other setting covers (None: leave them in float).

        Example:
            >>> XNNPACKQuantizer().set_global(None).global_config is None
            True
        """
        check_config(quantization_config, "set_global")
        self.global_config = quantization_config
        return self

    def set_module_name(
        self, module_name: str, quantization_config: QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config of the nodes inside the submodule ``module_name`` (e.g. ``"layer1.0.conv1"``).

        ``None`` leaves that submodule in float.

        Example:
            >>> XNNPACKQuantizer().set_module_name("fc", None).module_name_config
            {'fc': None}
        """
        if not isinstance(module_name, str):
            raise ConfigError(
                f"set_module_name: module_name must be a str such as 'layer1.0.conv1' (as in "
                f"model.named_modules()), got {type(module_name).__name__}; for a class use "
                f"set_module_type"
            )
        check_config(quantization_config, f"set_module_name({module_name!r})")
        self.module_name_config[module_name] = quantization_config
        return self

    def set_module_type(
        self, module_type: type, quantization_config: QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config of the nodes inside any module of class ``module_type`` (e.g. ``nn.Conv2d``).

        Example:
            >>> import torch
            >>> XNNPACKQuantizer().set_module_type(torch.nn.Conv2d, None).module_type_config
            {<class 'torch.nn.modules.conv.Conv2d'>: None}
        """
        if not isinstance(module_type, type):
            raise ConfigError(
                f"set_module_type: module_type must be a module class such as torch.nn.Conv2d, "
                f"got {module_type!r}; for functions and ATen operators use set_operator_type"
            )
        check_config(quantization_config, f"set_module_type({module_type.__name__})")
        self.module_type_config[module_type] = quantization_config
        return self

    def set_operator_type(
        self, operator_type: OperatorLike, quantization_config: QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config of the patterns whose main operator is ``operator_type``.

        Args:
            operator_type: a torch function (``F.conv2d``, ``torch.add``), a Tensor method
                (``torch.Tensor.view``) or an ATen operator (``torch.ops.aten.linear.default``).
            quantization_config: the config, or None to leave those operators in float.

        Example:
            >>> import torch
            >>> q = XNNPACKQuantizer().set_operator_type(torch.add, None)
            >>> q.operator_type_config[torch.add] is None
            True
        """
        ops = resolve_operator(operator_type)
        check_config(quantization_config, f"set_operator_type({_op_label(operator_type)})")
        self._operators[operator_type] = ops
        self.operator_type_config[operator_type] = quantization_config
        return self

    def set_object_type(
        self, object_type: type | OperatorLike, quantization_config: QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """:meth:`set_module_type` for a module class, else :meth:`set_operator_type`.

        Example:
            >>> import torch
            >>> q = XNNPACKQuantizer().set_object_type(torch.nn.Linear, None)
            >>> list(q.module_type_config)
            [<class 'torch.nn.modules.linear.Linear'>]
        """
        if isinstance(object_type, type):
            return self.set_module_type(object_type, quantization_config)
        return self.set_operator_type(object_type, quantization_config)

    def to_code(self) -> str | None:
        """The Python expression that builds this quantizer, or None if a config is not one of
        :func:`get_symmetric_quantization_config`'s (or a setting names a type or operator).

        Example:
            >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
            >>> print(q.set_module_name("fc", None).to_code())
            XNNPACKQuantizer().set_global(get_symmetric_quantization_config()).set_module_name('fc', None)
        """  # noqa: E501
        if self.module_type_config or self.operator_type_config:
            return None
        parts = ["XNNPACKQuantizer()"]
        if self.global_config is not None:
            code = config_code(self.global_config)
            if code is None:
                return None
            parts.append(f".set_global({code})")
        for name, config in self.module_name_config.items():
            code = config_code(config)
            if code is None:
                return None
            parts.append(f".set_module_name({name!r}, {code})")
        return "".join(parts)

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Turn scalar operands of add/mul into tensor constants so they can be quantized.

        Example:
            >>> import torch
            >>> class AddOne(torch.nn.Module):
            ...     def forward(self, x):
            ...         return x + 1
            >>> gm = torch.export.export(AddOne(), (torch.randn(2),)).module()
            >>> gm = XNNPACKQuantizer().transform_for_annotation(gm)
            >>> [n.name for n in gm.graph.nodes if n.op == "get_attr"]
            ['_tensor_constant_0']
        """
        return scalars_to_tensors(_graph_module(model, "transform_for_annotation"))

    def annotate(self, model: GraphModule) -> GraphModule:
        """Annotate ``model`` in place with every setting, then propagate sharing; return it.

        Passes run most specific setting first; within a pass the patterns run in
        :data:`~qviz.engine.quantizers.annotators.STATIC_ANNOTATORS` order (dynamic configs:
        linear only). Operator nodes left in float get ``qviz_float_reason`` / ``_detail``.

        Raises:
            ConfigError: ``model`` is not a torch.fx GraphModule, or a ``set_module_name``
                names no module of it (a typo), with the closest names.

        Example: see the module docstring.
        """
        model = _graph_module(model, "annotate")
        check_module_names(model, self.module_name_config, "set_module_name")
        for node in model.graph.nodes:
            node.meta.pop(FLOAT_REASON_KEY, None)
            node.meta.pop(FLOAT_DETAIL_KEY, None)
        self._settings = {node: self._governing(node) for node in model.graph.nodes}
        claimed: set[Node] = set()
        for config, scope in self._passes():
            dynamic = config.input_activation is not None and config.input_activation.is_dynamic
            for annotator in DYNAMIC_ANNOTATORS if dynamic else STATIC_ANNOTATORS:
                for partition in annotator(model, config, scope):
                    claimed.update(partition)
        propagate_shared(model, self._keeps_float)
        self._record_float_reasons(model, claimed)
        self._settings = {}
        return model

    def quantization_capabilities(self) -> list[Capability]:
        """What this quantizer quantizes, per pattern and setting (see
        :mod:`qviz.engine.quantizers.capabilities`).

        Example:
            >>> XNNPACKQuantizer().quantization_capabilities()  # nothing configured
            []
        """
        from qviz.engine.quantizers.xnnpack_capabilities import xnnpack_capabilities

        return xnnpack_capabilities(self)

    def validate(self, model: GraphModule) -> None:
        """Nothing to check beyond what prepare checks (torchao's validate is empty too).

        Example:
            >>> XNNPACKQuantizer().validate(None)
        """

    # -- which setting governs a node --------------------------------------------------------

    def _module_setting(self, node: Node) -> _Setting | None:
        for name in reversed(module_names(node)):
            if name in self.module_name_config:
                config = self.module_name_config[name]
                return _Setting("module name", name, config, f"set_module_name({name!r}, ...)")
        by_name = {qualified_name(tp): tp for tp in self.module_type_config}
        for type_name in reversed(module_type_names(node)):
            if type_name in by_name:
                tp = by_name[type_name]
                call = f"set_module_type({tp.__name__}, ...)"
                return _Setting("module type", tp, self.module_type_config[tp], call)
        return None

    def _operator_setting(self, node: Node) -> _Setting | None:
        for op, ops in self._operators.items():
            if operator_matches(node, ops):
                config = self.operator_type_config[op]
                return _Setting("operator", op, config, f"set_operator_type({_op_label(op)}, ...)")
        return None

    def _governing(self, node: Node) -> _Setting:
        setting = self._module_setting(node) or self._operator_setting(node)
        return setting or _Setting("global", None, self.global_config, "set_global(...)")

    def _keeps_float(self, node: Node) -> bool:
        setting = self._settings.get(node) or self._governing(node)
        return setting.config is None

    def _in_module(self, kind: str, key: object) -> Callable[[Node], bool]:
        def region(node: Node) -> bool:
            setting = self._settings.get(node) or self._governing(node)
            return setting.kind == kind and setting.key == key

        return region

    def _quantized_outside_modules(self, node: Node) -> bool:
        setting = self._settings.get(node) or self._governing(node)
        return setting.kind in ("operator", "global") and setting.config is not None

    def _operator_anchor(self, op: OperatorLike | None) -> Callable[[Node], bool]:
        def anchor(node: Node) -> bool:
            setting = self._operator_setting(node)
            return setting is None if op is None else setting is not None and setting.key is op

        return anchor

    def _passes(self) -> list[tuple[QuantizationConfig, Scope]]:
        """(config, scope) of each annotation pass, most specific setting first."""
        passes: list[tuple[QuantizationConfig | None, Scope]] = []
        for name, config in self.module_name_config.items():
            passes.append((config, Scope(region=self._in_module("module name", name))))
        for tp, config in self.module_type_config.items():
            passes.append((config, Scope(region=self._in_module("module type", tp))))
        for op, config in self.operator_type_config.items():
            passes.append(
                (config, Scope(self._quantized_outside_modules, self._operator_anchor(op)))
            )
        passes.append(
            (
                self.global_config,
                Scope(self._quantized_outside_modules, self._operator_anchor(None)),
            )
        )
        return [(config, scope) for config, scope in passes if config is not None]

    # -- why nodes stay in float -------------------------------------------------------------

    def _record_float_reasons(self, model: GraphModule, claimed: set[Node]) -> None:
        for node in model.graph.nodes:
            if node.op != "call_function" or node in claimed:
                continue
            if node.meta.get(Q_ANNOTATION_KEY) is not None:
                continue
            setting = self._settings[node]
            if setting.config is None:
                record_float_reason(node, *_filtered(setting))
            elif node.meta.get(FLOAT_REASON_KEY) != DTYPE_CONSTRAINT:
                record_float_reason(node, PATTERN_UNSUPPORTED, _unsupported(node, setting))


def _filtered(setting: _Setting) -> tuple[str, str]:
    """(reason, detail) for a node whose governing setting is None."""
    call = setting.call.replace("...", "None")
    if setting.kind == "module name":
        return FILTERED_BY_MODULE_NAME, call
    if setting.kind == "module type":
        return FILTERED_BY_MODULE_TYPE, call
    if setting.kind == "operator":
        return USER_FALLBACK, call
    return USER_FALLBACK, "no global config: call set_global(config) to quantize the rest"


def _unsupported(node: Node, setting: _Setting) -> str:
    op = getattr(node.target, "__name__", str(node.target))
    config = setting.config
    if config is not None and config.input_activation is not None:
        if config.input_activation.is_dynamic:
            return f"{op}: dynamic quantization covers linear only"
    if node.target in SHARE_OPS:
        source = node.args[0] if node.args else None
        name = getattr(source, "name", source)
        return f"{op} shares its input's quantization, but its input {name} is not quantized"
    return f"XNNPACKQuantizer has no pattern for {op} here"


def _graph_module(model: object, where: str) -> GraphModule:
    if not isinstance(model, GraphModule):
        raise ConfigError(
            f"XNNPACKQuantizer.{where} needs the graph module qviz.export returns "
            f"(torch.export.export(model, inputs).module()), got {type(model).__name__}"
        )
    return model
