"""A pure-torch core attention for context parallelism on CPU proxy runs.

megatron-core's local `DotProductAttention` asserts "Context parallelism is only supported by
TEDotProductAttention!", and TransformerEngine needs CUDA. This stand-in keeps megatron-core's
zig-zag sequence split (`megatron.core.utils.get_batch_on_this_cp_rank`: the sequence is cut into
2 * CP chunks and CP rank r keeps chunks r and 2 * CP - 1 - r) and computes exact causal attention by
all-gathering K and V across the CP group, with a causal mask built from each token's global position.
Losses equal the CP = 1 run. Its communication (one all-gather of K/V per layer, an all-reduce of their
gradients in backward) differs from TE's ring attention (CP - 1 point-to-point steps), so timings
taken with it are CPU stand-in figures, not a model of TE's overlap.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

__all__ = ["ContextParallelCoreAttention", "zigzag_positions"]


def zigzag_positions(seq_local: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Global positions of the `seq_local` tokens CP rank `cp_rank` holds (chunks r and 2*CP-1-r)."""
    chunk = seq_local // 2
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second_start = (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([first, torch.arange(second_start, second_start + chunk)])


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward sums the gradient over the group and keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        size = torch.distributed.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        size = torch.distributed.get_world_size(ctx.group)
        rank = torch.distributed.get_rank(ctx.group)
        return grad.chunk(size, dim=0)[rank].contiguous(), None


class ContextParallelCoreAttention(MegatronModule):
    """Drop-in `core_attention` for the local layer spec (same constructor and forward as DotProductAttention)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None, **kwargs: Any) -> None:
        super().__init__(config=config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, tp)
        self.heads_per_partition = divide(config.num_attention_heads, tp)
        self.groups_per_partition = divide(config.num_query_groups, tp)
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None,
                **kwargs: Any) -> torch.Tensor:
        """query [sq, b, np, hn], key/value [sk, b, ng, hn] (local zig-zag halves) -> [sq, b, np * hn]."""
        group = parallel_state.get_context_parallel_group()
        cp_size, cp_rank = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
        key = _GatherSequence.apply(key, group)
        value = _GatherSequence.apply(value, group)
        repeat = self.heads_per_partition // self.groups_per_partition
        if repeat > 1:
            key = key.repeat_interleave(repeat, dim=2)
            value = value.repeat_interleave(repeat, dim=2)
        seq_local = query.size(0)
        q_pos = zigzag_positions(seq_local, cp_rank, cp_size)
        k_pos = torch.cat([zigzag_positions(seq_local, r, cp_size) for r in range(cp_size)])
        allowed = (k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)).to(query.device)  # [sq, sk], True = attend
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, np, s, hn]
        context = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
        )
        context = context.permute(2, 0, 1, 3).contiguous()  # [sq, b, np, hn]
        return context.view(context.size(0), context.size(1), self.hidden_size_per_partition)
