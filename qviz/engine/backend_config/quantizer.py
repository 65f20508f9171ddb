"""BackendConfigQuantizer: a backend declared as data, applied to an exported graph.

For each pattern of the BackendConfig (longest fused tuples first), every place it occurs
(:mod:`qviz.engine.backend_config.matching`) gets the QConfig the QConfigMapping gives there;
the first of the pattern's DTypeConfigs that QConfig fits (:mod:`.constraints`) decides, and the
pattern is annotated by its observation type: its own output observer, its input's observer
shared with the output, or nothing observed. Everything quantizable it leaves in float gets a
reason in the plan: no pattern for what the graph does (with the closest declared one), a
QConfig that fits none of the pattern's dtype configs (with the failed constraint), or a
QConfig of None.

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
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.backend_config.config import BackendConfig, BackendPatternConfig, pattern_name
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
from qviz.engine.backend_config.observers import observer_spec
from qviz.engine.backend_config.qconfig import QConfigMapping
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
from qviz.errors import AnnotationError


def _length(config: BackendPatternConfig) -> int:
    return len(config.pattern) if isinstance(config.pattern, tuple) else 1


def _activation_inputs(anchor: Node) -> list[Node]:
    return [n for n in anchor.all_input_nodes if n.op != "get_attr"]


class BackendConfigQuantizer(Quantizer):
    """Annotate what ``backend_config`` runs quantized, with the QConfigs of ``qconfig_mapping``.

    Args:
        backend_config: qviz's BackendConfig, or torch.ao's (e.g. the native / x86 config).
        qconfig_mapping: qviz's QConfigMapping, or torch.ao's.
    """

    def __init__(self, backend_config: Any, qconfig_mapping: Any) -> None:
        super().__init__()
        self.backend_config = BackendConfig.of(backend_config)
        self.qconfig_mapping = QConfigMapping.of(qconfig_mapping)
        self._specs: dict[int, Any] = {}
        #: anchor node name -> (pattern config, output node name) of each quantized match
        self._claims: dict[str, tuple[BackendPatternConfig, str]] = {}
        self._units: list[Unit] = []

    def annotate(self, model: GraphModule) -> GraphModule:
        check_module_names(model, self.qconfig_mapping.named_modules(), "QConfigMapping")
        self._claims = {}
        units = self._units = graph_units(model)
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

    def quantization_capabilities(self) -> list[Capability]:
        """One record per pattern and DTypeConfig of the backend (see
        :mod:`qviz.engine.quantizers.capabilities`): what it can run quantized, whatever the
        QConfigs."""
        observation = {
            ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT: "own observer",
            ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT: "shares its input's observer",
            ObservationType.INPUT_OUTPUT_NOT_OBSERVED: "not observed",
        }
        return [
            Capability(
                quantizer="BackendConfigQuantizer",
                pattern=pattern_name(config.pattern),
                observation=observation[config.observation_type],
                input=d.input_dtype_with_constraints.describe() if d.input_dtype else "float",
                output=d.output_dtype_with_constraints.describe() if d.output_dtype else "float",
                weight=d.weight_dtype_with_constraints.describe() if d.weight_dtype else "-",
                bias=str(d.bias_dtype).replace("torch.", "") if d.bias_dtype else "-",
                dynamic=bool(d.is_dynamic),
                setting=f"backend '{self.backend_config.name}'",
            )
            for config in self.backend_config.configs
            for d in config.dtype_configs
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
        for anchor_name, (config, last_name) in self._claims.items():
            anchor, last = nodes.get(anchor_name), nodes.get(last_name)
            if anchor is None or last is None:
                continue
            problem = annotation_problem(config, anchor, last)
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
        caller = unit.module.rpartition(".")[0] if isinstance(first, type) else unit.module
        earlier = self._units[: self._units.index(unit)]
        index = sum(
            1
            for u in earlier
            if element_matches(u, first)
            and (u.module.rpartition(".")[0] if isinstance(first, type) else u.module) == caller
        )
        return self.qconfig_mapping.qconfig_for(unit.module, first, index, caller)

    def _apply(self, config: BackendPatternConfig, chain: list[Unit]) -> None:
        anchor, nodes = chain[0].nodes[0], [n for u in chain for n in u.nodes]
        where = f"{pattern_name(config.pattern)} at {anchor.name}"
        qconfig = self._qconfig(config, chain)
        if qconfig is None:
            detail = f"the QConfigMapping gives None for {where} (module '{chain[0].module}')"
            for node in nodes:
                record_float_reason(node, USER_FALLBACK, detail)
            return
        act, act_facts = observer_spec(qconfig.activation, f"{where}: activation", self._specs)
        weight, weight_facts = observer_spec(qconfig.weight, f"{where}: weight", self._specs)
        weight_node = weight_of(anchor)
        problems = [
            dtype_config_problem(d, act_facts, weight_facts, weight_node is not None)
            for d in config.dtype_configs
        ]
        if None not in problems:
            why = problems[0] if problems else "the backend declares no DTypeConfig for it"
            detail = f"{where}: {why}"
            for node in nodes:
                record_float_reason(node, DTYPE_CONSTRAINT, detail)
            return
        dtypes = config.dtype_configs[problems.index(None)]
        mark_annotated(nodes)
        if config.observation_type is ObservationType.INPUT_OUTPUT_NOT_OBSERVED:
            return
        inputs = dict.fromkeys(_activation_inputs(anchor), act)
        if weight_node is not None and weight is not None:
            inputs[weight_node] = weight
        output = act if dtypes.output_dtype is not None and not act_facts.is_dynamic else None
        if config.observation_type is ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT and inputs:
            first = next(iter(inputs))
            output = SharedQuantizationSpec((first, anchor)) if output is not None else None
        last = chain[-1].output
        self._claims[anchor.name] = (config, last.name)
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
