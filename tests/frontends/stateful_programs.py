"""Random torch programs that write into their inputs and buffers, for fuzzing
torch.compile(backend="graphsub") (issue 49: a static key/value cache filled at the next
position by every run graphsub made while compiling).

Each seed picks a few writes from what models do to their state, and where the state lives:

- `counter`: a step counter advanced in place (`add_`), read as the position of the next
  write (transformers' StaticLayer keeps `cumulative_length` so);
- `index_copy`: a cache of past rows written at the counter's position with `index_copy_`,
  then attended over (the static key/value cache);
- `setitem`: the same cache written by indexing (`cache[:, pos] = rows`: an `index_put_`);
- `running_mean`: running statistics updated as batch norm does in training
  (`mul_(m).add_(...)`) and read after the update;
- `argument`: an in-place operation on an argument of the call (`x.mul_(...)`), read after it;
- `view`: a write through a view of a buffer (`state[0].copy_(...)`);
- `iadd`: `state += ...` on a buffer (dynamo's `operator.iadd`).

The state is a buffer of the module, or, with `state_as_argument`, tensors held by an object
handed to the call (as transformers' cache objects are, which dynamo lifts to inputs). Values
are kept from saturating: Xavier-scaled weights, inputs of unit variance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

WRITES = ("counter", "index_copy", "setitem", "running_mean", "argument", "view", "iadd")
#: Rows the cache holds: more than the calls a test makes.
CACHE_ROWS = 8
HIDDEN = 16


@dataclass(frozen=True)
class Choices:
    """What one seed picked."""

    writes: tuple[str, ...]
    state_as_argument: bool
    read_before_write: bool

    def text(self) -> str:
        return (f"writes={','.join(self.writes)} state_as_argument={self.state_as_argument} "
                f"read_before_write={self.read_before_write}")


def choices(seed: int, writes: tuple[str, ...] | None = None) -> Choices:
    rng = np.random.default_rng(seed)
    drawn = tuple(str(w) for w in rng.choice(WRITES, size=int(rng.integers(1, 4)),
                                             replace=False))
    return Choices(writes=writes or drawn, state_as_argument=bool(rng.random() < 0.4),
                   read_before_write=bool(rng.random() < 0.5))


class State:
    """The tensors a program writes, held by a plain object (as a cache object holds them)."""

    def __init__(self, batch: int) -> None:
        gen = torch.Generator().manual_seed(1)
        self.count = torch.zeros((), dtype=torch.long)
        self.cache = torch.randn(batch, CACHE_ROWS, HIDDEN, generator=gen) * 0.5
        self.mean = torch.randn(HIDDEN, generator=gen) * 0.1
        self.acc = torch.zeros(batch, HIDDEN)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"count": self.count, "cache": self.cache, "mean": self.mean, "acc": self.acc}

    def copy(self) -> State:
        other = State.__new__(State)
        for name, t in self.tensors().items():
            setattr(other, name, t.clone())
        return other


class StatefulProgram(nn.Module):
    """A projection, then the chosen writes into the state and reads of it, then an output
    that depends on everything written."""

    def __init__(self, c: Choices, batch: int = 2) -> None:
        super().__init__()
        self.c = c
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        if not c.state_as_argument:
            for name, t in State(batch).tensors().items():
                self.register_buffer(name, t)

    def forward(self, x: torch.Tensor, state: State | None = None) -> torch.Tensor:
        s = state if state is not None else self
        c = self.c
        h = torch.tanh(self.proj(x))                       # (batch, HIDDEN)
        early = s.cache.mean(1) if c.read_before_write else torch.zeros_like(h)
        position = s.count.clone().reshape(1)
        if "counter" in c.writes or "index_copy" in c.writes or "setitem" in c.writes:
            s.count.add_(1)
        if "index_copy" in c.writes:
            s.cache.index_copy_(1, position, h[:, None, :])
        if "setitem" in c.writes:
            s.cache[:, position] = (h * 0.5)[:, None, :]
        if "running_mean" in c.writes:
            s.mean.mul_(0.9).add_(0.1 * h.mean(0))
        if "argument" in c.writes:
            x.mul_(0.5)
        if "view" in c.writes:
            s.acc[0].copy_(h[0] * 2)
        if "iadd" in c.writes:
            s.acc += h
        scores = torch.einsum("bd,brd->br", h, s.cache).softmax(-1)
        attended = torch.einsum("br,brd->bd", scores, s.cache)
        y = self.out(attended + h - s.mean + x + early) + s.acc
        return y * (1 + s.count.float() / CACHE_ROWS)


def program(seed: int, writes: tuple[str, ...] | None = None) -> StatefulProgram:
    torch.manual_seed(seed)
    module = StatefulProgram(choices(seed, writes)).eval()
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
    return module


def state_of(module: StatefulProgram, state: State | None) -> dict[str, torch.Tensor]:
    """Every tensor the program may write, by name."""
    return state.tensors() if state is not None else dict(module.named_buffers())
