"""What one micro-batch leaves saved, summed: per layer (`layer_activation_bytes`, by the layer's kind), its
transients (`transient_activation_bytes`), and the building blocks of a layout (`UnitActivations`: every kind of
layer, the embedding, the output layer, MTP, each with its named terms) that a chunk and a stage sum
(`chunk_bytes`). The tensors themselves are `autotune/cost/activations.py`'s and `moe_activations.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune.cost.activations import (
    BF16,
    ActivationAssumptions,
    Shape,
    attention_activation_bytes,
    backward_working_set,
    cuda_graph_static_bytes,
    embedding_activation_bytes,
    loss_transient_bytes,
    mamba_activation_bytes,
    mlp_activation_bytes,
    norm_terms,
    output_activation_bytes,
    shape_of,
)
from autotune.cost.moe_activations import moe_activation_bytes, moe_capacity_working_set, paged_stash_of
from autotune.cost.placement import chunk_kinds
from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["layer_activation_bytes", "hybrid_layer_activation_bytes", "mtp_activation_bytes",
           "transient_activation_bytes", "chunk_bytes", "UnitActivations", "unit_activation_bytes"]


def layer_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, *,
                           moe: bool, kind: str | None = None) -> dict[str, float]:
    """One transformer layer, one micro-batch, one GPU, by tensor. Full recompute keeps only the layer input
    (Korthikanti Table 2 'full': 2sbh, /t with SP); the rest is recomputed in the backward pass. `kind` is a hybrid
    layer's symbol (`M`, `*`, `-`, `E`: one block each, `hybrid_layer_activation_bytes`)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    if x.recompute == "full":
        return {"layer_input": BF16 * x.tokens * model.hidden_size / x.sp_div}
    if kind is not None:
        return hybrid_layer_activation_bytes(job, layout, assumptions, x, kind)
    terms = attention_activation_bytes(model, x)
    if moe:
        terms.update(moe_activation_bytes(model, x, layout, assumptions.moe_token_imbalance,
                                          job.training.moe_permute_fusion, paged_stash_of(job, layout, assumptions)))
    else:
        terms.update(mlp_activation_bytes(model, x, model.ffn_hidden_size))
    if layout.cuda_graphs == "transformer_engine" and x.te:
        terms["cuda_graph_buffers"] = cuda_graph_static_bytes(job, layout, x, moe=moe)
    return terms


def hybrid_layer_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, x: Shape,
                                  kind: str) -> dict[str, float]:
    """One hybrid layer of symbol `kind` (megatron-core `models/hybrid/hybrid_block.py`): `M` the Mamba layer,
    `*` the attention block alone, `-` the MLP alone, `E` the MoE block alone; plus the static buffers of its
    captured graphs (TE graphs: input, output and their gradients, 4 x 2 T h / t*, when its scope is captured)."""
    model = job.model
    if kind == "M":
        terms = mamba_activation_bytes(model, x)
    elif kind == "*":
        terms = attention_activation_bytes(model, x)
    elif kind == "-":
        terms = mlp_activation_bytes(model, x, model.ffn_hidden_size)
    else:
        terms = moe_activation_bytes(model, x, layout, assumptions.moe_token_imbalance,
                                     job.training.moe_permute_fusion, paged_stash_of(job, layout, assumptions))
    if layout.cuda_graphs == "transformer_engine" and x.te:
        scopes = set(job.cuda_graph_modules)
        scope = {"M": "mamba", "*": "attn", "-": "mlp"}.get(kind)
        boundary = 4 * BF16 * x.tokens * model.hidden_size / x.sp_div
        if kind == "E":
            terms["cuda_graph_buffers"] = cuda_graph_static_bytes(job, layout, x, moe=True) - (
                boundary if "attn" in scopes or not scopes else 0.0)
        else:
            terms["cuda_graph_buffers"] = boundary if (not scopes or scope in scopes) else 0.0
    return terms


def mtp_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions,
                         vocab: int) -> dict[str, float]:
    """One multi-token-prediction layer, one micro-batch (megatron-core 0.16.1
    `transformer/multi_token_prediction.py::MultiTokenPredictionLayer`, `models/gpt/gpt_model.py:608-660`): the
    embedding of the shifted tokens, `enorm` and `hnorm` (inputs and statistics), `eh_proj`'s input [s, b, 2h]
    (a TE column-parallel linear, saved like the other GEMM inputs), one transformer layer of the decoder's last
    kind, `final_layernorm`, and the output layer's input and logits once more. With full recompute the MTP layer
    is checkpointed (`_checkpointed_forward`): it keeps its two inputs, the logits stay."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    T, h = x.tokens, model.hidden_size
    out = {f"mtp_{k}": v for k, v in output_activation_bytes(model, x, vocab).items()}
    if x.recompute == "full":
        out["mtp_layer_inputs"] = 2 * BF16 * T * h / x.sp_div
        return out
    terms = {f"mtp_{k}": v for k, v in embedding_activation_bytes(model, x).items()}
    terms.update({f"mtp_{k}": v for k, v in norm_terms("enorm", x, h).items()})
    terms.update({f"mtp_{k}": v for k, v in norm_terms("hnorm", x, h).items()})
    terms["mtp_eh_proj_input"] = x.gemm_in * T * 2 * h / x.sp_div
    layer = layer_activation_bytes(job, layout, assumptions, moe=model.moe is not None)
    terms.update({f"mtp_layer_{k}": v for k, v in layer.items()})
    terms.update(out)
    return terms


def transient_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, *,
                               has_output: bool, has_moe: bool, vocab: int) -> dict[str, float]:
    """Memory live for one micro-batch only, counted once per stage:
    - `backward_working_set`: one layer's activation gradients (`backward_working_set`);
    - `moe_capacity_working_set`: with the paged stash, the MoE layer in flight at the rank capacity
      (`moe_capacity_working_set`);
    - full recompute: one layer's complete activations while it is recomputed in the backward pass
      (Korthikanti Sec. 5), on the last stage only what exceeds the freed logits (measured on CPU proxies);
    - `loss_transient`: what the loss holds beside its saved tensors while it runs (`loss_transient_bytes`)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    out: dict[str, float] = {}
    loss = loss_transient_bytes(job, x, vocab) if has_output else 0.0
    stash = paged_stash_of(job, layout, assumptions) if has_moe else None
    if assumptions.transformer_engine:
        out["backward_working_set"] = backward_working_set(job, layout, x, has_moe=has_moe, stash=stash is not None)
    if stash is not None:
        out["moe_capacity_working_set"] = moe_capacity_working_set(model, x, layout, stash)
    if layout.recompute == "full":
        plain = replace(layout, recompute="none")
        if model.hybrid_pattern is not None:  # the largest of the hybrid layer kinds the model has
            working = max(sum(layer_activation_bytes(job, plain, assumptions, moe=False, kind=k).values())
                          for k in set(model.hybrid_pattern) if k != "E" or has_moe)
        else:
            working = sum(layer_activation_bytes(job, plain, assumptions,
                                                 moe=has_moe and model.moe is not None).values())
        if has_output:
            working = max(0.0, working - loss - sum(output_activation_bytes(model, x, vocab).values()))
        out["recompute_working_set"] = working
    if has_output and loss:
        out["loss_transient"] = loss
    return out


def chunk_bytes(u: Any, split: tuple[Any, Any, Any, Any], *, mamba: int, attention: int, mtp: int,
                has_embedding: bool, has_output: bool) -> Any:
    """What one micro-batch leaves saved on a model chunk: its layers by kind, MTP layers, the embedding on the
    first chunk and the output layer on the last, from the building blocks `u` (a `UnitActivations`, or its fields
    as arrays of layouts) and the chunk's `split` into (recomputed dense, recomputed MoE, kept dense, kept MoE)
    layers (`UnitActivations._split`)."""
    rd, rm, kd, km = split
    total = rd * u.dense_layer + rm * u.moe_layer + kd * u.dense_kept + km * u.moe_kept
    if mamba or attention:
        total = total + mamba * u.mamba_layer + attention * u.attention_layer
    if mtp:
        total = total + mtp * u.mtp
    if has_embedding:
        total = total + u.embedding
    if has_output:
        total = total + u.output
    return total


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitActivations:
    """Per-micro-batch activation bytes of the building blocks for one layout, so that a stage's activations
    are `sum(in-flight x chunk)` plus the transients. `*_terms` keep the breakdown by tensor.
    `full_layers` (None: every layer) is the block of layers per chunk that full recompute covers
    (`recompute_method=block`, `recompute_num_layers`); the other layers keep `*_kept_terms`."""

    dense_terms: tuple[tuple[str, float], ...]
    moe_terms: tuple[tuple[str, float], ...]
    dense_kept_terms: tuple[tuple[str, float], ...]
    moe_kept_terms: tuple[tuple[str, float], ...]
    embedding_terms: tuple[tuple[str, float], ...]
    output_terms: tuple[tuple[str, float], ...]
    mtp_terms: tuple[tuple[str, float], ...]
    transient_terms: dict[tuple[bool, bool], tuple[tuple[str, float], ...]]
    mamba_terms: tuple[tuple[str, float], ...]  # a hybrid `M` layer (() for a GPT model)
    attention_terms: tuple[tuple[str, float], ...]  # a hybrid `*` layer (() for a GPT model)
    full_layers: int | None
    dense_layer: float
    moe_layer: float
    dense_kept: float
    moe_kept: float
    embedding: float
    output: float
    mtp: float
    mamba_layer: float = 0.0
    attention_layer: float = 0.0

    def _split(self, dense: int, moe: int) -> tuple[int, int, int, int]:
        """(recomputed dense, recomputed MoE, kept dense, kept MoE) layers of a chunk: the block of
        `full_layers` is the chunk's first layers (megatron-core `transformer_block.py`, method 'block')."""
        if self.full_layers is None:
            return dense, moe, 0, 0
        n = min(self.full_layers, dense + moe)
        rd = min(dense, n)
        rm = n - rd
        return rd, rm, dense - rd, moe - rm

    def chunk(self, *, dense: int, moe: int, has_embedding: bool, has_output: bool, mtp: int = 0, mamba: int = 0,
              attention: int = 0) -> float:
        """A chunk's layers: GPT dense and MoE layers, or a hybrid chunk's `-`, `E`, `M` and `*` layers."""
        return chunk_bytes(self, self._split(dense, moe), mamba=mamba, attention=attention, mtp=mtp,
                           has_embedding=has_embedding, has_output=has_output)

    def transient(self, *, has_output: bool, has_moe: bool) -> float:
        return sum(v for _, v in self.transient_terms[(has_output, has_moe)])

    def breakdown(self, *, chunks: tuple[tuple[int, int, int], ...], inflight: tuple[int, ...], first_dense: int,
                  last: int, has_output: bool, has_moe: bool, transients: bool = True,
                  mtp: tuple[int, ...] | None = None, pattern: str | None = None) -> tuple[tuple[str, float], ...]:
        """The named terms of one stage: in-flight micro-batches x chunk terms, plus (optionally) transients.
        `mtp` gives the MTP layers of every model chunk (by chunk index k), None for none; `pattern` a hybrid
        model's layer symbols (`chunk_kinds`)."""
        out: dict[str, float] = {}

        def add(terms: tuple[tuple[str, float], ...], weight: float) -> None:
            if not weight:
                return
            for name, value in terms:
                out[name] = out.get(name, 0.0) + weight * value

        for (k, start, n), n_inflight in zip(chunks, inflight, strict=False):
            dense, moe, mamba, attention = chunk_kinds(pattern, first_dense, start, n)
            add(self.mamba_terms, n_inflight * mamba)
            add(self.attention_terms, n_inflight * attention)
            rd, rm, kd, km = self._split(dense, moe)
            add(self.dense_terms, n_inflight * rd)
            add(self.moe_terms, n_inflight * rm)
            add(self.dense_kept_terms, n_inflight * kd)
            add(self.moe_kept_terms, n_inflight * km)
            if k == 0:
                add(self.embedding_terms, n_inflight)
            if k == last:
                add(self.output_terms, n_inflight)
            if mtp is not None and mtp[k]:
                add(self.mtp_terms, n_inflight * mtp[k])
        if transients:
            add(self.transient_terms[(has_output, has_moe)], 1)
        return tuple(out.items())


def unit_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions,
                          vocab: int) -> UnitActivations:
    """The building blocks for `layout` (only TP, SP, CP, MBS, ETP and recompute matter)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    hybrid = model.hybrid_pattern is not None

    def layer(kind: str | None, moe: bool) -> tuple[tuple[str, float], ...]:
        return tuple(layer_activation_bytes(job, layout, assumptions, moe=moe, kind=kind).items())

    dense = layer("-" if hybrid else None, False)
    moe = layer("E" if hybrid else None, True) if model.moe is not None else ()
    mamba = layer("M", False) if model.mamba is not None else ()
    attention = layer("*", False) if hybrid else ()
    full_layers = job.training.recompute_num_layers if layout.recompute == "full" else None
    if full_layers is not None:
        kept_layout = replace(layout, recompute="none")
        dense_kept = tuple(layer_activation_bytes(job, kept_layout, assumptions, moe=False).items())
        moe_kept = tuple(layer_activation_bytes(job, kept_layout, assumptions, moe=True).items()) \
            if model.moe is not None else ()
    else:
        dense_kept, moe_kept = (), ()
    emb = tuple(embedding_activation_bytes(model, x).items())
    out = tuple(output_activation_bytes(model, x, vocab).items())
    mtp = tuple(mtp_activation_bytes(job, layout, assumptions, vocab).items()) if model.mtp_num_layers else ()
    transients = {
        (o, m): tuple(transient_activation_bytes(job, layout, assumptions, has_output=o, has_moe=m,
                                                 vocab=vocab).items())
        for o in (False, True) for m in (False, True)
    }
    return UnitActivations(
        dense_terms=dense, moe_terms=moe, dense_kept_terms=dense_kept, moe_kept_terms=moe_kept,
        embedding_terms=emb, output_terms=out, mtp_terms=mtp, transient_terms=transients, full_layers=full_layers,
        dense_layer=sum(v for _, v in dense), moe_layer=sum(v for _, v in moe),
        dense_kept=sum(v for _, v in dense_kept), moe_kept=sum(v for _, v in moe_kept),
        embedding=sum(v for _, v in emb), output=sum(v for _, v in out), mtp=sum(v for _, v in mtp),
        mamba_terms=mamba, attention_terms=attention, mamba_layer=sum(v for _, v in mamba),
        attention_layer=sum(v for _, v in attention),
    )
