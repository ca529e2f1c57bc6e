"""graphsub's torch backend: graphs lowered to FX programs of torch operations, run on the CPU
or a GPU (optionally captured in CUDA graphs), and the `torch-cpu` / `torch-cuda` targets.

    from graphsub.targets.torch import TorchProgram
    program = TorchProgram(graph, "cuda")
    outputs = program(*inputs)           # device tensors in, device tensors out
    program.module                       # the torch.fx.GraphModule (hand it to inductor)

A graph with size symbols gets a SizedTorchProgram (`TorchTarget.program` picks it), which
runs inputs of every size in the symbols' ranges.
"""

from graphsub.targets.torch.lowering import lowered_ops
from graphsub.targets.torch.program import (CudaGraphReplay, SizedTorchProgram, TorchProgram,
                                             TorchRunnable)
from graphsub.targets.torch.target import TorchCpuTarget, TorchCudaTarget, TorchTarget
from graphsub.errors import NoLoweringError

__all__ = ["CudaGraphReplay", "NoLoweringError", "SizedTorchProgram", "TorchCpuTarget",
           "TorchCudaTarget", "TorchProgram", "TorchRunnable", "TorchTarget", "lowered_ops"]
