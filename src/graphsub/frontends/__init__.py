"""Frontends: other ways into graphsub than an ONNX file (the torch.compile backend)."""
