"""BackendConfigQuantizer: a backend declared as data, applied to an exported graph.

For each pattern of the BackendConfig (longest fused tuples first), every place it occurs
(:mod:`qviz.engine.backend_config.matching`) gets the QConfig the QConfigMapping gives there;
the first of the pattern's DTypeConfigs that QConfig fits (:mod:`.constraints`) decides, and the
pattern is annotated by its observation type: its own output observer, its input's observer
shared with the output, or nothing observed. A pattern with a fuser method is quantized as FX
quantizes it: by the config of the module it fuses into (the tutorial's ``(Conv2d, ReLU)``
config only fuses; its ``ConvReLU2d`` config has the dtypes). Everything quantizable it leaves
in float gets a reason in the plan: no pattern for what the graph does (with the closest
declared one), a QConfig that fits none of the pattern's dtype configs (with the failed
constraint), a fused module the backend has no config for, or a QConfig of None.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from torch.ao.quantization import get_default_qconfig
    >>> from qviz.engine.backend_config import (BackendConfig, BackendPatternConfig,
    ...     DTypeConfig, QConfigMapping)
    >>> backend = BackendConfig("b").set_backend_pattern_config(BackendPatternConfig(nn.Linear)
    ...     .add_dtype_config(DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)))
    >>> mapping = QConfigMapping().set_global(get_default_qconfig("x86"))
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()).eval()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> plan = qviz.prepare_pt2e(gm, BackendConfigQuantizer(backend, mapping)).plan
    >>> [(f.node, str(f.reason)) for f in plan.float_nodes]
    [('sigmoid', 'pattern unsupported')]
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.backend_config.config import (
    BackendConfig,
    BackendPatternConfig,
    fused_form,
    pattern_name,
)
from qviz.engine.backend_config.constraints import (
    annotation_problem,
    dtype_config_problem,
    is_weighted,
    weight_of,
)
from qviz.engine.backend_config.dtypes import ObservationType
from qviz.engine.backend_config.matching import (
    Unit,
    element_matches,
    first_nodes,
    following_units,
    graph_units,
    match_chain,
    unit_chain,
)
from qviz.engine.backend_config.observers import observer_spec, same_constructor
from qviz.engine.backend_config.qconfig import QConfigMapping
from qviz.engine.graph.module_stack import module_names
from qviz.engine.pt2e.plan import QUANTIZABLE_OPS
from qviz.engine.quantizers.annotate import (
    DTYPE_CONSTRAINT,
    PATTERN_UNSUPPORTED,
    USER_FALLBACK,
    annotate,
    mark_annotated,
    record_float_reason,
)
from qviz.engine.quantizers.base import Quantizer
from qviz.engine.quantizers.capabilities import Capability
from qviz.engine.quantizers.scope import check_module_names
from qviz.engine.specs import SharedQuantizationSpec
from qviz.errors import AnnotationError, ConfigError, closest_names


def _length(config: BackendPatternConfig) -> int:
    return len(config.pattern) if isinstance(config.pattern, tuple) else 1


def _activation_inputs(anchor: Node) -> list[Node]:
    return [n for n in anchor.all_input_nodes if n.op != "get_attr"]


def _caller(unit: Unit, element: Any) -> str:
    """The module that makes the call ``unit`` (a layer is called by its parent; a function
    by the module whose forward it is in), as set_module_name_object_type_order counts it."""
    return unit.module.rpartition(".")[0] if isinstance(element, type) else unit.module


def _same_qconfig(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return same_constructor(a.activation, b.activation) and same_constructor(a.weight, b.weight)


def _type_name(object_type: Any) -> str:
    return getattr(object_type, "__name__", None) or repr(object_type)


class _Resolved:
    """How a pattern config's matches are quantized: by ``target``'s observation type and
    dtype configs (itself, or the config of the module it fuses into; None: FX fuses it into
    ``fused``, a module the backend has no config for)."""

    def __init__(self, config: BackendPatternConfig, backend: BackendConfig) -> None:
        self.fused, self.members = fused_form(config)
        self.target = config if self.fused is None else backend.config_for(self.fused)


class BackendConfigQuantizer(Quantizer):
    """Annotate what ``backend_config`` runs quantized, with the QConfigs of ``qconfig_mapping``.

    Args:
        backend_config: qviz's BackendConfig, or torch.ao's (e.g. the native / x86 config).
        qconfig_mapping: qviz's QConfigMapping, or torch.ao's.
    """

    def __init__(self, backend_config: Any, qconfig_mapping: Any) -> None:
        super().__init__()
        self.backend_config = BackendConfig.of(
            backend_config, "BackendConfigQuantizer(backend_config=...)"
        )
        self.qconfig_mapping = QConfigMapping.of(
            qconfig_mapping, "BackendConfigQuantizer(qconfig_mapping=...)"
        )
        self._specs: dict[int, Any] = {}
        #: anchor node name -> (pattern config, the config whose dtype configs it was quantized
        #: by, output node name) of each quantized match
        self._claims: dict[str, tuple[BackendPatternConfig, BackendPatternConfig, str]] = {}
        self._units: list[Unit] = []
        self._resolved: dict[int, _Resolved] = {}

    def _resolve(self, config: BackendPatternConfig) -> _Resolved:
        resolved = self._resolved.get(id(config))
        if resolved is None:
            resolved = self._resolved[id(config)] = _Resolved(config, self.backend_config)
        return resolved

    def annotate(self, model: GraphModule) -> GraphModule:
        check_module_names(model, self.qconfig_mapping.named_modules(), "QConfigMapping")
        self._claims, self._resolved = {}, {}  # the backend may have changed since
        units = self._units = graph_units(model)
        self._check_mapping(model, units)
        by_first = first_nodes(units)
        claimed: set[Unit] = set()
        configs = sorted(self.backend_config.configs, key=_length, reverse=True)
        for config in configs:
            for unit in units:
                if unit in claimed:
                    continue
                chain = match_chain(unit, config.pattern, by_first)
                if chain is None or any(u in claimed for u in chain):
                    continue
                claimed.update(chain)
                self._apply(config, chain)
        self._explain_unmatched(units, by_first, claimed)
        return model

    def _check_mapping(self, model: GraphModule, units: list[Unit]) -> None:
        """Settings of the QConfigMapping that would apply to nothing in ``model``: a module
        name regex no module name matches, a call index past the calls a module makes."""
        mapping = self.qconfig_mapping
        known = {name for node in model.graph.nodes for name in module_names(node)} - {""}
        for regex in mapping.module_name_regex_qconfigs:
            if not any(re.match(regex, name) for name in known):
                raise ConfigError(
                    f"set_module_name_regex({regex!r}, ...): the regex matches no module that "
                    f"calls an operator of this graph ({closest_names(regex, known)}); it is "
                    f"matched with re.match from the start of the full name, as "
                    f"model.named_modules() spells it (e.g. r'layer\\d\\.0\\.conv1')"
                )
        for name, object_type, index in mapping.module_name_object_type_order_qconfigs:
            count = sum(
                1
                for u in units
                if element_matches(u, object_type) and _caller(u, object_type) == name
            )
            if index >= count:
                calls = f"indices 0..{count - 1}" if count else "no call to index"
                raise ConfigError(
                    f"set_module_name_object_type_order({name!r}, {_type_name(object_type)}, "
                    f"{index}, ...): module {name or '(the top level)'!r} calls "
                    f"{_type_name(object_type)} {count} time(s) in this graph ({calls}), so "
                    f"index {index} names no call; the index counts that type's calls made by "
                    f"the module itself, from 0, in forward order"
                )

    def quantization_capabilities(self) -> list[Capability]:
        """One record per pattern and DTypeConfig of the backend (see
        :mod:`qviz.engine.quantizers.capabilities`): what it can run quantized, whatever the
        QConfigs."""
        observation = {
            ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT: "own observer",
            ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT: "shares its input's observer",
            ObservationType.INPUT_OUTPUT_NOT_OBSERVED: "not observed",
        }
        resolved = [(c, self._resolve(c).target) for c in self.backend_config.configs]
        return [  # a fusing pattern: the dtypes of the module it fuses into, as FX runs it
            Capability(
                quantizer="BackendConfigQuantizer",
                pattern=pattern_name(config.pattern),
                observation=observation[target.observation_type],
                input=d.input_dtype_with_constraints.describe() if d.input_dtype else "float",
                output=d.output_dtype_with_constraints.describe() if d.output_dtype else "float",
                weight=d.weight_dtype_with_constraints.describe() if d.weight_dtype else "-",
                bias=str(d.bias_dtype).replace("torch.", "") if d.bias_dtype else "-",
                dynamic=bool(d.is_dynamic),
                setting=f"backend '{self.backend_config.name}'",
            )
            for config, target in resolved
            if target is not None
            for d in target.dtype_configs
        ]

    def validate(self, model: GraphModule) -> None:
        """Check that every quantized match still fits one of its pattern's DTypeConfigs.

        The annotations this quantizer wrote fit by construction; this catches edits made on
        top of them (an OverrideQuantizer, the AnnotationEditor) that the backend cannot run.

        Raises:
            AnnotationError: a match's annotation fits none of its pattern's DTypeConfigs; the
                message names the node, the pattern and the violated constraint.
        """
        nodes = {n.name: n for n in model.graph.nodes}
        for anchor_name, (config, target, last_name) in self._claims.items():
            anchor, last = nodes.get(anchor_name), nodes.get(last_name)
            if anchor is None or last is None:
                continue
            problem = annotation_problem(target, anchor, last)
            if problem is not None:
                raise AnnotationError(
                    f"{anchor.format_node()}: backend '{self.backend_config.name}' cannot run "
                    f"{pattern_name(config.pattern)} as annotated: {problem}; keep the "
                    f"annotation within the backend's DTypeConfigs "
                    f"(quantizer.quantization_capabilities() lists them)"
                )

    def _qconfig(self, config: BackendPatternConfig, chain: list[Unit]) -> Any:
        first = config.pattern[0] if isinstance(config.pattern, tuple) else config.pattern
        unit = chain[0]
        caller = _caller(unit, first)
        earlier = self._units[: self._units.index(unit)]
        index = sum(1 for u in earlier if element_matches(u, first) and _caller(u, first) == caller)
        return self.qconfig_mapping.qconfig_for(unit.module, first, index, caller)

    def _check_fused_qconfigs(self, resolved: _Resolved, where: str) -> None:
        """FX gives a fused module the QConfig its members' types have, and refuses (a
        LookupError) when the QConfigMapping sets different ones by type."""
        by_type = self.qconfig_mapping.object_type_qconfigs
        if not by_type or not resolved.members:
            return
        first, *rest = resolved.members
        for member in rest:
            if not _same_qconfig(by_type.get(member), by_type.get(first)):
                raise ConfigError(
                    f"{where}: the backend fuses it into {_type_name(resolved.fused)}, which "
                    f"takes one QConfig, but the QConfigMapping's set_object_type gives "
                    f"{_type_name(first)} and {_type_name(member)} different ones (one may be "
                    f"unset); set the same QConfig for every type of the pattern, e.g. "
                    f"set_object_type(torch.nn.{_type_name(member)}, qconfig) (torch.ao's "
                    f"prepare_fx refuses this too)"
                )

    def _apply(self, config: BackendPatternConfig, chain: list[Unit]) -> None:
        anchor, nodes = chain[0].nodes[0], [n for u in chain for n in u.nodes]
        where = f"{pattern_name(config.pattern)} at {anchor.name}"
        resolved = self._resolve(config)
        self._check_fused_qconfigs(resolved, where)
        qconfig = self._qconfig(config, chain)
        if qconfig is None:
            detail = f"the QConfigMapping gives None for {where} (module '{chain[0].module}')"
            for node in nodes:
                record_float_reason(node, USER_FALLBACK, detail)
            return
        target = resolved.target
        if target is None:
            fused = _type_name(resolved.fused)
            detail = (
                f"{where}: backend '{self.backend_config.name}' fuses it into {fused} (its "
                f"fuser method) but has no BackendPatternConfig({fused}) to quantize that; add "
                f"one with the dtype configs (as the BackendConfig tutorial's "
                f"fused_conv_relu_config)"
            )
            for node in nodes:
                record_float_reason(node, PATTERN_UNSUPPORTED, detail)
            return
        act, act_facts = observer_spec(qconfig.activation, f"{where}: activation", self._specs)
        weight, weight_facts = observer_spec(qconfig.weight, f"{where}: weight", self._specs)
        weight_node = weight_of(anchor)
        problems = [
            dtype_config_problem(d, act_facts, weight_facts, weight_node is not None)
            for d in target.dtype_configs
        ]
        if None not in problems:
            why = problems[0] if problems else "the backend declares no DTypeConfig for it"
            if target is not config:
                why += f" (the dtype configs of {pattern_name(target.pattern)}, its fused form)"
            detail = f"{where}: {why}"
            for node in nodes:
                record_float_reason(node, DTYPE_CONSTRAINT, detail)
            return
        dtypes = target.dtype_configs[problems.index(None)]
        mark_annotated(nodes)
        if target.observation_type is ObservationType.INPUT_OUTPUT_NOT_OBSERVED:
            return
        inputs = dict.fromkeys(_activation_inputs(anchor), act)
        if weight_node is not None and weight is not None:
            inputs[weight_node] = weight
        output = act if dtypes.output_dtype is not None and not act_facts.is_dynamic else None
        if target.observation_type is ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT and inputs:
            first = next(iter(inputs))
            output = SharedQuantizationSpec((first, anchor)) if output is not None else None
        last = chain[-1].output
        self._claims[anchor.name] = (config, target, last.name)
        annotate(anchor, inputs, output if last is anchor else None)
        if last is not anchor:
            annotate(last, {}, output)

    def _explain_unmatched(
        self, units: list[Unit], by_first: dict[Node, Unit], claimed: set[Unit]
    ) -> None:
        declared = [pattern_name(c.pattern) for c in self.backend_config.configs]
        part_of: dict[Unit, str] = {}  # a relu after an unmatched conv: say the conv's story
        for unit in units:
            if unit in claimed or unit in part_of:
                continue
            # a weighted layer's story is its chain (conv-bn-relu); another op's is itself
            length = 3 if is_weighted(unit.nodes[0]) else 1 + len(unit.folded)
            chain = unit_chain(unit, by_first, length)
            does = "(" + ", ".join(chain) + ")" if len(chain) > 1 else chain[0]
            close = difflib.get_close_matches(does, declared, n=1, cutoff=0.4)
            head = f"backend '{self.backend_config.name}' has no pattern for {does}"
            head += f"; closest: {close[0]}" if close else ""
            followers = following_units(unit, by_first, len(chain) - 1 - len(unit.folded))
            for follower in followers:
                if follower not in claimed:
                    part_of[follower] = f"part of {does} at {unit.nodes[0].name}: {head}"
            self._record_unmatched(unit, f"{unit.nodes[0].name}: {head}")
        for unit, detail in part_of.items():
            self._record_unmatched(unit, f"{unit.output.name}: {detail}")

    @staticmethod
    def _record_unmatched(unit: Unit, detail: str) -> None:
        for node in unit.nodes:
            if node.target in QUANTIZABLE_OPS and "qviz_float_reason" not in node.meta:
                record_float_reason(node, PATTERN_UNSUPPORTED, detail)
