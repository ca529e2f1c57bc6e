"""numpy arrays and torch tensors, both ways, bfloat16 included.

numpy has no bfloat16 of its own: graphsub's arrays hold ml_dtypes' (what onnx reads and
writes), which torch cannot take or give directly (`tensor.numpy()` raises "Got unsupported
ScalarType BFloat16"). Both hold the same 16 bits per element, so the conversion goes through
an int16 view of the same memory, without rounding anything.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def to_torch(array: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor on `device` holding a copy of the array (weights are read-only numpy arrays,
    which torch will not wrap)."""
    array = np.require(array, requirements="C")
    if array.dtype == _BFLOAT16:
        return torch.tensor(array.view(np.int16), device=device).view(torch.bfloat16)
    return torch.tensor(array, device=device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's values as a numpy array on the host, in its own type."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return np.asarray(t.view(torch.int16).numpy()).view(_BFLOAT16)
    return np.asarray(t.numpy())
