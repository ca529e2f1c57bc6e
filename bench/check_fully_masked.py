"""What each ONNX fuser does to a fully masked sequence (issue 18): a BERT export with an
attention mask input, fed a mask of all zeros for one of the two sequences in the batch, so
that every query of it has nothing to attend to.

    python bench/check_fully_masked.py

PyTorch's scaled_dot_product_attention gives such a query zeros, and the dynamo exporter keeps
that with a guard after the softmax (Where(IsNaN(p), 0, p)). The fused attention kernels of
onnxruntime's transformers optimizer and onnxscript's ORT fusions have no such guard; graphsub
keeps it. Prints, per model, the largest difference from eager PyTorch on the masked
sequence and on the unmasked one.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fission_ort import peers  # noqa: E402

import graphsub  # noqa: E402
from graphsub.optimizer import optimize_model  # noqa: E402


def main() -> None:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=1024, vocab_size=1000)
    model = tf.BertModel(config).eval()
    ids = torch.randint(0, 1000, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.int64)
    mask[1] = 0  # the second sequence: every position masked
    with torch.no_grad():
        want = model(ids, attention_mask=mask).last_hidden_state.numpy()
    folder = Path(tempfile.mkdtemp())
    path = folder / "bert_masked.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (ids,), kwargs={"attention_mask": mask}, dynamo=True,
                          verbose=False).save(str(path))
    files = {"export": path.read_bytes()}
    for name, got in peers("bert", path).items():
        if isinstance(got, bytes):
            files[name] = got
        else:
            print(f"{name}: {got}")
    original = path.read_bytes()
    files["graphsub"], _ = optimize_model(graphsub.load(path), original, path.name,
                                          time_limit=20, target="ort-cpu")
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    print(f"eager PyTorch, masked sequence: max |output| {np.abs(want[1]).max():.3g}")
    print("| model | max difference from eager, masked sequence | unmasked sequence |")
    print("|---|---|---|")
    for name, data in files.items():
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        got = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]
        diff = np.abs(got - want)
        print(f"| {name} | {np.nanmax(diff[1]) if not np.isnan(diff[1]).any() else 'NaN'} "
              f"| {diff[0].max():.2e} |")
    onnx.checker.check_model(onnx.load_from_string(files["graphsub"]))


if __name__ == "__main__":
    main()
