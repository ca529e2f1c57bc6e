"""Models exported from PyTorch with dynamic sizes, as people export them: transformers'
BERT and Llama (grouped-query attention, rotary embeddings) with an attention mask, through
the dynamo exporter and the TorchScript one (`dynamic_axes`); a CNN with a dynamic batch; an
OCR-style recognizer whose width is dynamic. Small configurations with random weights, so
that tests export them in seconds."""

from __future__ import annotations

import warnings
from pathlib import Path

TEXT_MODELS = ("bert", "llama")
EXPORTERS = ("dynamo", "legacy")


def text_module(kind: str):
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if kind == "bert":
        inner = BertModel(BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=512,
                                     max_position_embeddings=512), add_pooling_layer=False)
    else:
        inner = LlamaModel(LlamaConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=256, max_position_embeddings=1024))

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            extra = {"use_cache": False} if kind == "llama" else {}
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              **extra).last_hidden_state

    return LastHiddenState().eval()


def _export(module, args, path: Path, exporter: str, names: tuple[list[str], list[str]],
            axes: dict[str, dict[int, str]]) -> Path:
    import torch

    inputs, outputs = names
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {name: torch.export.Dim(name, min=1, max=4096 if name != "batch" else 1024)
                    for spec in axes.values() for name in spec.values()}
            shapes = tuple({axis: dims[name] for axis, name in axes[n].items()}
                           for n in inputs)
            torch.onnx.export(module, args, str(path), dynamo=True, dynamic_shapes=shapes,
                              input_names=inputs, output_names=outputs, verbose=False)
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                              input_names=inputs, output_names=outputs, dynamic_axes=axes)
    return path


def export_text(kind: str, exporter: str, folder: Path) -> Path:
    """`kind` (bert or llama) exported by `exporter` into `folder`: inputs input_ids and
    attention_mask of shape batch x seq, output last_hidden_state (batch x seq x 128)."""
    import torch

    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"}}
    return _export(text_module(kind), (ids, mask), folder / f"{kind}_{exporter}.onnx", exporter,
                   (["input_ids", "attention_mask"], ["last_hidden_state"]), axes)


def export_cnn(folder: Path, exporter: str = "legacy") -> Path:
    """A small image classifier (convolutions, batch norm, pooling, a linear head) whose
    batch is dynamic."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    axes = {"pixels": {0: "batch"}, "logits": {0: "batch"}}
    return _export(net, (torch.randn(2, 3, 32, 32),), folder / f"cnn_{exporter}.onnx", exporter,
                   (["pixels"], ["logits"]), axes)


def export_ocr(folder: Path, exporter: str = "legacy") -> Path:
    """An OCR-style line recognizer: convolutions over a 32-pixel-high text line of dynamic
    width, the height folded into channels, a per-column classifier and log-softmax
    (what CRNN-style models end with before CTC decoding)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Recognizer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
            self.classify = nn.Linear(32 * 8, 40)

        def forward(self, line):
            f = self.features(line)                   # batch x 32 x 8 x width/2
            b, c, h, w = f.shape
            f = f.permute(0, 3, 1, 2).reshape(b, w, c * h)
            return torch.log_softmax(self.classify(f), dim=-1)

    axes = {"line": {0: "batch", 3: "width"}, "log_probs": {0: "batch", 1: "steps"}}
    return _export(Recognizer().eval(), (torch.randn(2, 1, 32, 100),),
                   folder / f"ocr_{exporter}.onnx", exporter, (["line"], ["log_probs"]), axes)
