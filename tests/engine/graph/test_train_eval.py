"""train() / eval() on exported, prepared and converted models.

Without :func:`qviz.allow_exported_model_train_eval` both refuse, as on torch.export's own
modules (the reference does the same): they would not switch the recorded dropout / batch-norm
ops. qviz's move_exported_model_to_eval / _to_train are checked against torchao's functions of
the same names on the same graphs (outputs bit for bit with the same seed, BatchNorm buffers),
and against the eager model.
"""

import copy

import pytest
import torch
import torchao.quantization.pt2e as ao
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e as ao_prepare_qat_pt2e
from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer as AoXNNPACKQuantizer
from torchao.testing.pt2e._xnnpack_quantizer import (
    get_symmetric_quantization_config as ao_symmetric_config,
)

import qviz
from qviz.data import digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError, ExportedModeError
from tests.helpers.quantize import quantize

aten = torch.ops.aten
MODE_OPS = {aten.batch_norm.default: 5, aten.dropout.default: 2}


def _stages():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.ReLU())
    x = torch.rand(2, 3, 5, 5)
    gm, prepared, converted = quantize(model, [x], per_channel=False)
    return x, {"exported": gm, "prepared": prepared, "converted": converted}


@pytest.mark.parametrize("call", ["train", "eval"])
def test_switching_mode_refuses_at_every_stage_and_says_what_to_do(call):
    x, stages = _stages()
    for gm in stages.values():  # issue 25: qviz.export's own result too, not torch's raw error
        with pytest.raises(NotImplementedError):
            getattr(gm, call)()
        with pytest.raises(ExportedModeError, match=r"model\.eval\(\) before qviz\.export"):
            getattr(gm, call)()
        with pytest.raises(ExportedModeError, match="allow_exported_model_train_eval"):
            getattr(gm, call)()
    # the models still run, in the mode they were exported in: dropout stays off
    converted = stages["converted"]
    assert torch.equal(converted(x), converted(x))


# ---- against torchao and the eager model ----------------------------------------------------


def _eager(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "digits":
        return digits_model().train(), torch.rand(6, 1, 8, 8)
    if name == "conv_bn_relu_dropout":
        layers = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5)]
    else:  # a BatchNorm after ReLU: not folded by prepare, so it switches there too
        layers = [nn.Conv2d(3, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Dropout(0.5)]
    return nn.Sequential(*layers).train(), torch.rand(4, 3, 6, 6)


def _qat(gm: torch.fx.GraphModule, stage: str) -> torch.fx.GraphModule:
    """``gm`` prepared for QAT by qviz (skipped until qviz has it) or by torchao."""
    if stage == "qat_torchao":
        config = ao_symmetric_config(is_per_channel=True, is_qat=True)
        return ao_prepare_qat_pt2e(gm, AoXNNPACKQuantizer().set_global(config))
    if not hasattr(qviz, "prepare_qat_pt2e"):
        pytest.skip("qviz.prepare_qat_pt2e is not there yet")
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    return qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))


def _graph(name: str, stage: str) -> tuple[nn.Module, torch.fx.GraphModule, torch.Tensor]:
    """The eager model and its export in train mode, prepared (for PTQ, or QAT by qviz or
    torchao) or converted (buffers copied)."""
    eager, x = _eager(name)
    gm = qviz.export(copy.deepcopy(eager), (x,))
    if stage.startswith("qat"):
        return eager, _qat(gm, stage), x
    if stage != "exported":
        config = get_symmetric_quantization_config(is_per_channel=True)
        gm = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
        qviz.move_exported_model_to_eval(gm)  # calibrate on the running statistics
        qviz.calibrate(gm, [x, x * 0.5], progress=False)
        if stage == "converted":
            gm = qviz.convert_pt2e(gm)
    return eager, gm, x


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_" in k}


def _mode_args(gm: torch.fx.GraphModule) -> list[bool]:
    return [n.args[i] for n in gm.graph.nodes for op, i in MODE_OPS.items() if n.target == op]


def _outputs(models: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for model in models:
        torch.manual_seed(1)  # the same dropout masks in each
        outs.append(model(x))
    return outs


MODELS = ["conv_bn_relu_dropout", "conv_relu_bn_dropout", "digits"]


@pytest.mark.parametrize("stage", ["exported", "prepared", "converted", "qat", "qat_torchao"])
@pytest.mark.parametrize("name", MODELS)
def test_each_mode_runs_as_torchaos_does_bit_for_bit(name, stage):
    _, gm, x = _graph(name, stage)
    ours, theirs = copy.deepcopy(gm), copy.deepcopy(gm)
    for mode in ["eval", "train", "train", "eval", "train"]:
        assert getattr(qviz, f"move_exported_model_to_{mode}")(ours) is ours
        getattr(ao, f"move_exported_model_to_{mode}")(theirs)
        assert _mode_args(ours) == _mode_args(theirs) == [mode == "train"] * len(_mode_args(ours))
        for _ in range(2):  # the second output sees the statistics the first one updated
            mine, reference = _outputs([ours, theirs], x)
            assert torch.equal(mine, reference), (mode, (mine - reference).abs().max())
        stats, reference_stats = _buffers(ours), _buffers(theirs)
        for key, value in reference_stats.items():
            if not key.endswith("num_batches_tracked"):  # torchao counts in eval mode too
                assert torch.equal(stats[key], value), (mode, key)


@pytest.mark.parametrize("name", MODELS)
def test_an_exported_model_matches_the_eager_model_in_each_mode(name):
    eager, gm, x = _graph(name, "exported")
    for mode in ["eval", "train", "eval", "train"]:
        getattr(eager, mode)()
        getattr(qviz, f"move_exported_model_to_{mode}")(gm)
        before = _buffers(gm)
        for _ in range(2):
            mine, reference = _outputs([gm, eager], x)
            assert torch.equal(mine, reference), mode
        stats = _buffers(gm)
        assert stats.keys() == _buffers(eager).keys()
        for key, value in _buffers(eager).items():  # num_batches_tracked included
            assert torch.equal(stats[key], value), (mode, key)
        changed = {k for k in stats if not torch.equal(stats[k], before[k])}
        assert changed == (set(stats) if mode == "train" else set()), mode


def test_batch_norm_statistics_update_in_train_mode_only_after_prepare():
    _, gm, x = _graph("conv_relu_bn_dropout", "prepared")
    assert any(n.target == aten.batch_norm.default for n in gm.graph.nodes)  # not folded
    before = _buffers(gm)
    qviz.move_exported_model_to_eval(gm)(x)
    assert all(torch.equal(v, before[k]) for k, v in _buffers(gm).items())
    qviz.move_exported_model_to_train(gm)(x)
    assert not any(torch.equal(v, before[k]) for k, v in _buffers(gm).items())


def test_other_dropouts_and_custom_momentum_eps_and_p_switch_as_in_eager_mode():
    """torchao's pattern rewrite resets p / momentum / eps to 0.5 / 0.1 / 1e-5 and leaves
    Dropout2d and AlphaDropout alone; qviz only sets the mode argument."""
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4, eps=1e-3, momentum=0.3),
        nn.Dropout(0.2),
        nn.Dropout2d(0.3),
        nn.AlphaDropout(0.1),
        nn.Dropout(0.4, inplace=True),
    ).eval()
    x = torch.rand(4, 3, 6, 6)
    gm = qviz.export(copy.deepcopy(eager), (x,))
    for mode in ["train", "eval", "train"]:
        getattr(eager, mode)()
        getattr(qviz, f"move_exported_model_to_{mode}")(gm)
        for _ in range(2):
            mine, reference = _outputs([gm, eager], x)
            assert torch.equal(mine, reference), mode
        for key, value in _buffers(eager).items():
            if not key.endswith("num_batches_tracked"):  # exported in eval: no counter
                assert torch.equal(_buffers(gm)[key], value), (mode, key)
    bn = next(n for n in gm.graph.nodes if n.target == aten.batch_norm.default)
    assert bn.args[5:8] == (True, 0.3, 1e-3)
    theirs = ao.move_exported_model_to_train(qviz.export(copy.deepcopy(eager.eval()), (x,)))
    bn = next(n for n in theirs.graph.nodes if n.target == aten.batch_norm.default)
    assert bn.args[5:8] == (True, 0.1, 1e-5)  # why qviz does not pattern-replace


# ---- idempotence and allow_exported_model_train_eval ---------------------------------------


def _count_recompiles(gm: torch.fx.GraphModule) -> list[int]:
    count = [0]
    real = gm.recompile

    def counting():
        count[0] += 1
        return real()

    gm.recompile = counting
    return count


def test_repeated_calls_change_nothing_and_do_not_recompile():
    _, gm, x = _graph("conv_bn_relu_dropout", "exported")
    count = _count_recompiles(gm)
    qviz.move_exported_model_to_train(gm)  # the first call always rewrites, as torchao's
    assert count[0] == 1
    qviz.move_exported_model_to_train(gm)
    assert count[0] == 1
    qviz.move_exported_model_to_eval(gm)
    code = gm.code
    for _ in range(2):
        qviz.move_exported_model_to_eval(gm)
    assert count[0] == 2 and gm.code == code and not gm.training
    mine, again = _outputs([gm, gm], x)
    assert torch.equal(mine, again)


def test_a_stale_state_attribute_does_not_stop_a_switch():
    _, gm, _ = _graph("conv_bn_relu_dropout", "exported")
    gm._exported_training = False  # e.g. copied from a model that was moved to eval
    qviz.move_exported_model_to_eval(gm)
    assert _mode_args(gm) == [False, False]


@pytest.mark.parametrize("stage", ["exported", "prepared", "converted", "qat"])
def test_after_allow_train_and_eval_switch_at_every_stage(stage):
    _, gm, x = _graph("conv_relu_bn_dropout", stage)
    with pytest.raises(NotImplementedError):
        gm.eval()
    assert qviz.allow_exported_model_train_eval(gm) is gm
    assert gm.eval() is gm and _mode_args(gm) == [False, False] and not gm.training
    assert torch.equal(*_outputs([gm, gm], x))
    assert gm.train() is gm and _mode_args(gm) == [True, True] and gm.training
    gm.train(False)
    assert _mode_args(gm) == [False, False]
    gm.train(True)
    assert _mode_args(gm) == [True, True]


def test_prepare_and_convert_of_an_allowed_model_refuse_again():
    _, gm, x = _graph("conv_relu_bn_dropout", "exported")
    qviz.allow_exported_model_train_eval(gm).eval()
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    with pytest.raises(ExportedModeError):
        prepared.train()
    qviz.allow_exported_model_train_eval(prepared).eval()
    qviz.calibrate(prepared, [x], progress=False)
    with pytest.raises(ExportedModeError):
        qviz.convert_pt2e(prepared).eval()


@pytest.mark.parametrize(
    "function",
    [
        qviz.move_exported_model_to_eval,
        qviz.move_exported_model_to_train,
        qviz.allow_exported_model_train_eval,
        qviz.freeze_bn_stats,
        qviz.update_bn_stats,
    ],
)
def test_a_model_that_is_not_an_exported_graph_is_a_config_error(function):
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    with pytest.raises(ConfigError, match=rf"{function.__name__} needs the graph module.*Seq"):
        function(model)
    with pytest.raises(ConfigError, match=r"not made by torch\.export"):
        function(torch.fx.symbolic_trace(model))
    assert model.training  # untouched


def _eager_with_frozen_bn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.3), nn.Dropout(0.3), nn.ReLU(),
        nn.Flatten(), nn.Linear(36, 5), nn.BatchNorm1d(5),
    )  # fmt: skip


def test_frozen_batch_norms_run_as_eager_bn_eval_and_stay_frozen_across_mode_switches():
    """Oracle: the eager model in train() with its BatchNorms in eval() (what eager QAT's
    freeze_bn_stats amounts to): outputs with the same seed and every buffer, bit for bit."""
    eager = _eager_with_frozen_bn().train()
    x = torch.randn(4, 3, 5, 5)
    gm = qviz.export(copy.deepcopy(eager), (x,))
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    assert qviz.freeze_bn_stats(gm) is gm
    for bn in (eager[1], eager[6]):
        bn.eval()
    for switch in (None, qviz.move_exported_model_to_eval, qviz.move_exported_model_to_train):
        if switch is not None:
            switch(gm)
        eager.train(switch is not qviz.move_exported_model_to_eval)
        for bn in (eager[1], eager[6]):
            bn.eval()
        torch.manual_seed(1)
        ours = gm(x)
        torch.manual_seed(1)
        assert torch.equal(ours, eager(x)), switch
        for key, value in gm.state_dict().items():  # statistics and batch counters unchanged
            assert torch.equal(value, before[key]), (switch, key)
    assert qviz.update_bn_stats(gm) is gm  # back to the model's mode: train
    eager.train()
    torch.manual_seed(2)
    ours = gm(x)
    torch.manual_seed(2)
    assert torch.equal(ours, eager(x))
    assert torch.equal(gm.state_dict()["1.running_var"], eager[1].running_var)
    assert int(gm.state_dict()["6.num_batches_tracked"]) == 1


def test_freezing_a_model_without_trainable_batch_norm_is_refused_with_the_fix():
    gm = qviz.export(_eager_with_frozen_bn().eval(), (torch.randn(2, 3, 5, 5),))
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )  # eval export: the BatchNorms are folded
    with pytest.raises(ConfigError, match=r"freeze_bn_stats: .*no batch_norm.*prepare_qat_pt2e"):
        qviz.freeze_bn_stats(prepared)
