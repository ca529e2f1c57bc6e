"""Random attention programs with their masks built the way transformers builds them, for
fuzzing torch.compile(backend="graphsub", dynamic=True).

transformers' BertModel under dynamic sizes once ran unoptimized on a size symbol no input
carried (issue 38): the masks and position ids are where a model computes with its sizes
(aranges over the sequence, comparisons of index grids, `finfo.min` fills, expands to the
scores' shape), so that is what these programs vary, one choice per seed:

- the mask: BERT's extended additive mask (`(1 - m[:, None, None, :]) * finfo.min`), a boolean
  padding mask expanded to the scores and filled with `masked_fill`, a causal mask from
  `torch.full(...).triu(1)`, one from comparing `arange` grids (masking_utils' index
  functions: `kv_idx <= q_idx`, a sliding window, the padding looked up at `[batch_idx,
  kv_idx]`), or a boolean mask handed to `scaled_dot_product_attention`;
- padding on the right or on the left (left padding with a causal mask leaves query rows with
  every key masked: eager gives them a uniform softmax over `finfo.min`, and an optimized
  program must too);
- where the scale goes (on the query, on the scores, as a division by sqrt(d)), a fused or
  three separate projections, heads split by view+transpose or reshape+permute, grouped
  key/value heads repeated as transformers' `repeat_kv` does, the softmax in float32 then
  cast back, dropout in eval mode, position embeddings indexed by an `arange` or by
  `cumsum(mask) - 1` (left padding).

Values are kept from saturating: Xavier-scaled weights, inputs of unit variance, at least a
quarter of each sequence real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

MASKS = ("bert_extended", "bool_masked_fill", "causal_triu", "causal_index", "sliding_window",
         "padding_index", "sdpa_bool")
#: Masks under which no query row ever has every key masked on right padding.
CAUSAL = ("causal_triu", "causal_index", "sliding_window")


@dataclass(frozen=True)
class Choices:
    """What one seed picked."""

    mask: str
    left_padding: bool
    scale_at: str  # "query", "scores" or "divide"
    fused_qkv: bool
    heads_by_view: bool
    kv_groups: int  # 1: as many key/value heads as query heads
    float32_softmax: bool
    positions: str  # "none", "arange", "cumsum" or "table" (a buffer sliced by the length)
    layers: int

    def text(self) -> str:
        return (f"mask={self.mask} left_padding={self.left_padding} scale_at={self.scale_at} "
                f"fused_qkv={self.fused_qkv} heads_by_view={self.heads_by_view} "
                f"kv_groups={self.kv_groups} float32_softmax={self.float32_softmax} "
                f"positions={self.positions} layers={self.layers}")


def choices(seed: int, mask: str | None = None) -> Choices:
    """The seed's choices (its mask, unless one is named)."""
    rng = np.random.default_rng(seed)
    drawn = str(rng.choice(MASKS))
    return Choices(mask=mask or drawn, left_padding=bool(rng.random() < 0.4),
                   scale_at=str(rng.choice(["query", "scores", "divide"])),
                   fused_qkv=bool(rng.random() < 0.5), heads_by_view=bool(rng.random() < 0.5),
                   kv_groups=int(rng.choice([1, 2])), float32_softmax=bool(rng.random() < 0.5),
                   positions=str(rng.choice(["none", "arange", "cumsum", "table"])),
                   layers=int(rng.choice([1, 2])))


class Attention(nn.Module):
    """One self-attention layer with its residual, written as the choices say."""

    def __init__(self, c: Choices, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.c, self.heads, self.head_dim = c, heads, hidden // heads
        self.kv_heads = heads // c.kv_groups
        kv = self.kv_heads * self.head_dim
        if c.fused_qkv:
            self.qkv = nn.Linear(hidden, hidden + 2 * kv)
        else:
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, kv), \
                nn.Linear(hidden, kv)
        self.o = nn.Linear(hidden, hidden)

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, s, _ = x.shape
        if self.c.heads_by_view:
            return x.view(b, s, heads, self.head_dim).transpose(1, 2)
        return x.reshape(b, -1, heads, self.head_dim).permute(0, 2, 1, 3)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """transformers' repeat_kv: each key/value head shared by kv_groups query heads."""
        if self.c.kv_groups == 1:
            return x
        b, h, s, d = x.shape
        x = x[:, :, None, :, :].expand(b, h, self.c.kv_groups, s, d)
        return x.reshape(b, h * self.c.kv_groups, s, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        c = self.c
        if c.fused_qkv:
            kv = self.kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([x.shape[-1], kv, kv], dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = self.split(q, self.heads), self.split(k, self.kv_heads), \
            self.split(v, self.kv_heads)
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        scale = 1.0 / math.sqrt(self.head_dim)
        if c.mask == "sdpa_bool":
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            if c.scale_at == "query":
                q = q * scale
            scores = q @ k.transpose(-1, -2)
            if c.scale_at == "scores":
                scores = scores * scale
            elif c.scale_at == "divide":
                scores = scores / math.sqrt(self.head_dim)
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            else:
                scores = scores + mask
            if c.float32_softmax:
                probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            else:
                probs = scores.softmax(dim=-1)
            probs = nn.functional.dropout(probs, p=0.1, training=self.training)
            out = probs @ v
        b, _, s, _ = out.shape
        out = out.transpose(1, 2).reshape(b, s, -1)
        return x + self.o(out)


class MaskedAttentionProgram(nn.Module):
    """Position embeddings, the mask built from a (batch, seq) padding mask of 1s and 0s, and
    the attention layers; the output is every position's hidden state."""

    def __init__(self, c: Choices, hidden: int = 32, max_positions: int = 128) -> None:
        super().__init__()
        self.c = c
        self.positions = nn.Embedding(max_positions, hidden)
        # BERT's position ids: a table of every position, sliced by the sequence's length
        # (a slice by a size no tensor input of the part that reads it carries, issue 51)
        self.register_buffer("position_table", torch.arange(max_positions)[None, :],
                             persistent=False)
        self.layers = nn.ModuleList(Attention(c, hidden) for _ in range(c.layers))
        self.norm = nn.LayerNorm(hidden)

    def build_mask(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        c = self.c
        b, s = attention_mask.shape
        minimum = torch.finfo(dtype).min
        if c.mask == "bert_extended":
            extended = attention_mask[:, None, None, :].to(dtype)
            return (1.0 - extended) * minimum
        padding = attention_mask.bool()
        if c.mask in ("bool_masked_fill", "sdpa_bool"):
            return padding[:, None, None, :].expand(b, 1, s, s)
        q_idx = torch.arange(s, device=attention_mask.device)
        kv_idx = torch.arange(s, device=attention_mask.device)
        if c.mask == "causal_triu":
            causal = torch.full((s, s), minimum, dtype=dtype).triu(1)
            causal = causal[None, None, :, :].expand(b, 1, s, s)
            return causal.masked_fill(~padding[:, None, None, :], minimum)
        allowed = kv_idx[None, :] <= q_idx[:, None]
        if c.mask == "sliding_window":
            allowed = allowed & (q_idx[:, None] - kv_idx[None, :] < 5)
        if c.mask == "padding_index":
            allowed = torch.ones_like(allowed)
        batch_idx = torch.arange(b, device=attention_mask.device)
        # masking_utils' padding_mask_function: the padding looked up at [batch_idx, kv_idx]
        real = padding[batch_idx[:, None, None], kv_idx[None, None, :]].expand(b, s, s)
        both = (allowed[None, :, :] & real)[:, None, :, :]
        return torch.where(both, torch.tensor(0.0, dtype=dtype),
                           torch.tensor(minimum, dtype=dtype))

    def position_ids(self, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.c.positions == "cumsum":  # left padding: positions count the real tokens
            ids = attention_mask.long().cumsum(-1) - 1
            return ids.masked_fill(attention_mask == 0, 1)
        b, s = attention_mask.shape
        if self.c.positions == "table":
            return self.position_table[:, :s].expand(b, s)
        return torch.arange(s, device=attention_mask.device).unsqueeze(0).expand_as(
            attention_mask)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.c.positions != "none":
            x = x + self.positions(self.position_ids(attention_mask))
        mask = self.build_mask(attention_mask, x.dtype)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


def program(seed: int, mask: str | None = None) -> MaskedAttentionProgram:
    torch.manual_seed(seed)
    module = MaskedAttentionProgram(choices(seed, mask)).eval()
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 2:
                nn.init.xavier_uniform_(p)
    return module


def inputs(c: Choices, batch: int, seq: int, gen: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of unit variance and a padding mask: each sequence keeps at least a
    quarter of its tokens (the first sequence the fewest), padded on the side the seed chose.
    Under a mask that only pads (no causality), every query row has a real key; under a
    causal one with left padding, the padded rows have none, as in transformers."""
    x = torch.randn(batch, seq, 32, generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for row in range(batch):
        real = max(seq // 4, 1) if row == 0 else int(torch.randint(
            max(seq // 4, 1), seq + 1, (1,), generator=gen))
        if c.left_padding:
            mask[row, :seq - real] = 0
        else:
            mask[row, real:] = 0
    return x, mask
