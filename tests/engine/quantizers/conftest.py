"""Compare qviz's XNNPACKQuantizer with torchao's (the reference), node by node.

The ``compare`` fixture annotates two deep copies of one exported graph, one per quantizer, and
describes every node's annotation as plain values: input specs keyed by producer name, output
spec, ``allow_implicit_sharing`` and ``_annotated``. Observed specs compare dtype, range, qscheme,
ch_axis, is_dynamic and the observer class name with its bound arguments (e.g. eps); shared specs
compare the names of the edge or node they share; derived specs their sources and ranges; fixed
specs scale and zero_point.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from torch.fx import GraphModule

from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

KEY = "quantization_annotation"


def _names(edge_or_node) -> str | tuple[str, ...]:
    if isinstance(edge_or_node, tuple):
        return tuple(n.name for n in edge_or_node)
    return edge_or_node.name


def _ctor(ctr) -> tuple:
    partial = getattr(ctr, "p", ctr)
    func = getattr(partial, "func", partial)
    kwargs = getattr(partial, "keywords", {})
    return (getattr(func, "__name__", repr(func)), tuple(sorted(kwargs.items())))


def spec_key(spec) -> tuple | None:
    """A spec (qviz's or torchao's) as comparable values."""
    if spec is None:
        return None
    if hasattr(spec, "edge_or_node"):
        return ("shared", _names(spec.edge_or_node))
    ranges = (str(spec.dtype), spec.quant_min, spec.quant_max, str(spec.qscheme), spec.is_dynamic)
    if hasattr(spec, "derived_from"):
        return ("derived", tuple(_names(e) for e in spec.derived_from), *ranges, spec.ch_axis)
    if hasattr(spec, "scale"):
        return ("fixed", *ranges, spec.scale, spec.zero_point)
    return ("observed", *ranges, spec.ch_axis, _ctor(spec.observer_or_fake_quant_ctr))


def describe(gm: GraphModule) -> dict[str, tuple]:
    """node name -> (input specs by producer name, output spec, implicit sharing, annotated)."""
    out = {}
    for node in gm.graph.nodes:
        a = node.meta.get(KEY)
        if a is not None:
            inputs = {k.name: spec_key(v) for k, v in a.input_qspec_map.items()}
            out[node.name] = (
                inputs,
                spec_key(a.output_qspec),
                a.allow_implicit_sharing,
                a._annotated,
            )
    return out


def weights_in_their_module(gm: GraphModule) -> GraphModule:
    """Give get_attr nodes their user's nn_module_stack (for the reference's module filters).

    torchao's module-name/-type filters check every node of a pattern, weights included, but
    torch.export's get_attr nodes carry no nn_module_stack, so the reference never claims a conv
    (or a linear-relu) under set_module_name / set_module_type. qviz checks operator nodes only.
    Patching the reference's copy lets the comparison test the precedence rules themselves.
    """
    for node in gm.graph.nodes:
        users = [u for u in node.users if "nn_module_stack" in u.meta]
        if node.op == "get_attr" and users and "nn_module_stack" not in node.meta:
            node.meta["nn_module_stack"] = dict(users[0].meta["nn_module_stack"])
    return gm


def differing(ref_gm: GraphModule, qviz_gm: GraphModule) -> dict[str, tuple]:
    """node name -> (reference description, qviz description) where they differ."""
    a, b = describe(ref_gm), describe(qviz_gm)
    return {n: (a.get(n), b.get(n)) for n in a.keys() | b.keys() if a.get(n) != b.get(n)}


def _make(ref) -> SimpleNamespace:
    def annotate_both(gm, setup_ref, setup_qviz, patch_ref=False):
        ref_gm, qviz_gm = copy.deepcopy(gm), copy.deepcopy(gm)
        if patch_ref:
            weights_in_their_module(ref_gm)
        ref_q, qviz_q = setup_ref(ref.XNNPACKQuantizer()), setup_qviz(XNNPACKQuantizer())
        ref_q.annotate(ref_q.transform_for_annotation(ref_gm))
        qviz_q.annotate(qviz_q.transform_for_annotation(qviz_gm))
        return ref_gm, qviz_gm

    def check_same(gm, setup_ref, setup_qviz, known=(), patch_ref=False) -> GraphModule:
        """Annotate with both; exactly the ``known`` nodes differ. Returns qviz's graph."""
        ref_gm, qviz_gm = annotate_both(gm, setup_ref, setup_qviz, patch_ref)
        diff = differing(ref_gm, qviz_gm)
        report = "\n".join(f"{n}:\n  ref  {r}\n  qviz {q}" for n, (r, q) in sorted(diff.items()))
        assert set(diff) == set(known), report
        return qviz_gm

    def global_setup(per_channel: bool, dynamic: bool = False) -> tuple[Callable, Callable]:
        """(reference setup, qviz setup) with the same global config."""
        theirs = ref.get_symmetric_quantization_config(
            is_per_channel=per_channel, is_dynamic=dynamic
        )
        ours = get_symmetric_quantization_config(per_channel, is_dynamic=dynamic)
        return (lambda q: q.set_global(theirs)), (lambda q: q.set_global(ours))

    def qat_setup(per_channel: bool) -> Callable:
        """The reference with its PTQ specs but is_qat=True: it then runs its conv-bn patterns."""
        config = ref.get_symmetric_quantization_config(is_per_channel=per_channel)
        config = dataclasses.replace(config, is_qat=True)
        return lambda q: q.set_global(config)

    return SimpleNamespace(
        annotate_both=annotate_both,
        check_same=check_same,
        describe=describe,
        differing=differing,
        global_setup=global_setup,
        qat_setup=qat_setup,
        spec_key=spec_key,
    )


@pytest.fixture(scope="session")
def compare() -> SimpleNamespace:
    """Helpers comparing qviz with torchao's XNNPACKQuantizer (skips without torchao)."""
    return _make(pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer"))
