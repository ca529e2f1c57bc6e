"""GELUs as model code writes them, through PyTorch's exporters (dynamo and TorchScript) and
torch.compile: each becomes one operator (the ONNX forms are in test_forms.py)."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

import graphsub  # noqa: E402
from graphsub.cost import AnalyticCostModel  # noqa: E402
from graphsub.search.normal_form import normal_form  # noqa: E402
from tests.rules.test_forms import RULES, SQRT_2_OVER_PI  # noqa: E402


class Activations(torch.nn.Module):
    """Four linear layers, each followed by a GELU as models write it by hand or call it:
    GPT-2's NewGELU, an erf GELU dividing by math.sqrt(2), torch's own (exact and tanh)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        a, b, c, d = (linear(x) for linear in self.linears)
        new_gelu = 0.5 * a * (1.0 + torch.tanh(SQRT_2_OVER_PI
                                               * (a + 0.044715 * torch.pow(a, 3.0))))
        erf_gelu = b * 0.5 * (1.0 + torch.erf(b / math.sqrt(2.0)))
        exact = torch.nn.functional.gelu(c)
        tanh = torch.nn.functional.gelu(d, approximate="tanh")
        return new_gelu + erf_gelu + exact + tanh


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_gelus_of_exported_model_code_become_operators(tmp_path, exporter):
    path = tmp_path / "activations.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(Activations().eval(), (torch.randn(4, 16),), str(path),
                              dynamo=True, verbose=False)
        else:
            torch.onnx.export(Activations().eval(), (torch.randn(4, 16),), str(path),
                              dynamo=False, opset_version=17)
    graph = graphsub.load(str(path))
    rewritten = normal_form(graph, RULES, AnalyticCostModel("cpu"))[0]
    gelus = sorted(rewritten[n].attrs["approximate"] for n in rewritten.nodes_by_op("gelu"))
    assert gelus == ["none", "none", "tanh", "tanh"]
    assert not rewritten.nodes_by_op("erf") and not rewritten.nodes_by_op("tanh")


def test_the_gelus_of_model_code_become_operators_under_torch_compile():
    """torch.compile hands graphsub the ATen graph: NewGELU's pow and products, the erf GELU's
    division; torch's own gelu arrives as one operator already."""
    from graphsub.frontends import torch_compile

    torch._dynamo.reset()
    model = Activations().eval()
    compiled = torch.compile(model, backend="graphsub",
                             options={"time_limit": 3, "cost": "analytic", "race": False,
                                      "inductor": False})
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (part,) = torch_compile.reports()[-1].parts
    assert part.rules_used.get("gelu-kernel") == 1
    assert part.rules_used.get("gelu-tanh-kernel") == 1
