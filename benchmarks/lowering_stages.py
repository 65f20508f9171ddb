"""Where the time of ``qviz.lower(..., backend="xnnpack")`` goes, cold, stage by stage.

Run from the repository root::

    .venv/bin/python benchmarks/lowering_stages.py [digits resnet18]

Each model is lowered in a fresh process (the first lowering in a process pays for importing
ExecuTorch and for torch's first decompositions, which a user's ``make run`` or notebook pays
too), then once more in the same process (warm). Printed per model: importing ExecuTorch,
``torch.export``, ``to_edge_transform_and_lower`` (decompositions, partitioning, XNNPACK's own
passes), ``to_executorch`` (serialising the ``.pte``), loading it, and ``qviz.lower``'s own
total, cold and warm, with the machine it ran on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _machine import Stopwatch

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[3])  # benchmarks/, for _machine
import torch, qviz
from _machine import Stopwatch
from qviz.engine.graph.capture import dynamic_batch_shapes
from qviz.engine.lower.machine import machine
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
name = sys.argv[1]
if name == "digits":
    from qviz.data import digits_loaders, digits_model
    model, x = digits_model(), next(iter(digits_loaders(batch_size=8).calibration))[0]
else:
    import torchvision
    model, x = getattr(torchvision.models, name)(weights=None), torch.randn(8, 3, 224, 224)
gm = qviz.export(model.eval(), (x,), dynamic_batch=True)
config = get_symmetric_quantization_config(is_per_channel=True)
prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
qviz.calibrate(prepared, [x], progress=False)
converted = qviz.convert_pt2e(prepared)
if sys.argv[2] == "cold":  # the first lowering in this process, as a user's first one
    print(json.dumps(qviz.lower(converted, (x,), backend="xnnpack").lowering_seconds))
    sys.exit(0)
times = {}
with Stopwatch() as t:
    import executorch.exir as exir
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.runtime import Runtime
times["import ExecuTorch"] = t.seconds
with Stopwatch() as t:
    program = torch.export.export(converted, (x,), dynamic_shapes=dynamic_batch_shapes((x,), 64))
times["torch.export"] = t.seconds
with Stopwatch() as t:
    edge = exir.to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
times["to_edge_transform_and_lower"] = t.seconds
with Stopwatch() as t:
    buffer = edge.to_executorch().buffer
times["to_executorch"] = t.seconds
with Stopwatch() as t:
    Runtime.get().load_program(buffer).load_method("forward")
times["load"] = t.seconds
times["qviz.lower (warm)"] = qviz.lower(converted, (x,), backend="xnnpack").lowering_seconds
print(json.dumps({"machine": str(machine()), "stages": times}))
"""


def _child(name: str, mode: str) -> str:
    here = str(Path(__file__).resolve().parent)
    run = subprocess.run([sys.executable, "-c", _CHILD, name, mode, here], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return run.stdout.strip().splitlines()[-1]


def main() -> None:
    for name in sys.argv[1:] or ["digits", "resnet18"]:
        with Stopwatch() as watch:
            cold = float(_child(name, "cold"))
            staged = json.loads(_child(name, "stages"))
        print(f"\n{name} on {staged['machine']}")
        print(f"  qviz.lower (cold, first in its process): {cold:7.1f} s")
        for stage, seconds in staged["stages"].items():
            print(f"  {stage:40s} {seconds:7.1f} s")
        print(f"  (measured in {watch.seconds:.0f} s)")


if __name__ == "__main__":
    main()
