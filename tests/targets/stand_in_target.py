"""A test-only target: a stand-in for an onnxruntime execution provider that graphsub does not
verify with (TensorRT, OpenVINO), to show that the stages follow a target's declared
capabilities and never its name.

onnxruntime's OpenVINO provider installs from the package index (onnxruntime-ep-openvino, a
plugin library onnxruntime 1.32 registers), but on the AMD EPYC machines this project runs on
it lists no device, so no real session runs there; this target runs onnxruntime's CPU
provider and declares what such a provider would: its name starts with "ort-", it takes no
com.microsoft operators, and its outputs are verified on it (it is not graphsub's reference
runtime). Importing this module registers it.
"""

from __future__ import annotations

from graphsub.targets import declared_capabilities, register_target
from graphsub.targets.base import DeviceInfo
from graphsub.targets.capabilities import Capabilities
from graphsub.targets.ort import OrtTarget, cpu_model

NAME = "ort-stand-in"


register_target(NAME, f"{__name__}:StandInProviderTarget",
                Capabilities(runs="onnx", vendor_operators=False, is_reference=False))


class StandInProviderTarget(OrtTarget):
    name = NAME
    description = "test only: onnxruntime's CPU provider declared as a provider graphsub " \
                  "does not verify with"
    capabilities = declared_capabilities(NAME)
    #: How many times the stages ran a model on this target to check its outputs.
    runs_checked = 0

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def device(self) -> DeviceInfo:
        return DeviceInfo(self.name, cpu_model(), {"threads": str(self.threads)})

    def prepare(self, graph, onnx=None, label="", session=None):
        runnable = super().prepare(graph, onnx, label, session=session)
        target = type(self)
        original_run = runnable.run

        def counted(feeds):
            target.runs_checked += 1
            return original_run(feeds)

        runnable.run = counted
        return runnable

