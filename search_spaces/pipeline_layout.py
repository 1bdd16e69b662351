"""megatron-core's `pipeline_model_parallel_layout` string: parse it, count its layers, build balanced ones.

The grammar is `PipelineParallelLayerLayout.parse_str_to_list` (megatron-core 0.16.1 and 0.19.2,
`transformer/pipeline_parallel_layer_layout.py`, byte-identical in both):

1. commas are removed (purely cosmetic);
2. `(group)*n` repeats a parenthesised group n times (no nesting: the group cannot hold `)`), then
   `x*n` repeats the single character before it (`t*3` -> `ttt`, `|*3` -> three empty stages);
3. the result is split on `|`; each piece is one virtual stage (model chunk), empty pieces allowed;
4. `E` embedding, `L` loss, `t` a transformer (decoder) layer, `m` a multi-token-prediction layer; any
   other character fails `Invalid layer character`.

Flat stage i lives on pipeline rank i % PP, virtual chunk i // PP, so the stages are listed in the order
autotune calls "chunk order" (`Layout.chunk_layer_counts`: chunk c on stage c % PP); VPP = stages / PP.
DeepSeek-V3's published PP 8 x VPP 4 layout `Et|(tt|)*30mL` has 32 stages of two slots each.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["LAYER_CHARS", "LayoutSyntaxError", "parse_stages", "chunk_counts", "balanced_layout", "compress",
           "layout_from_chunks", "mtp_layout", "canonical", "MAX_EXPANDED_CHARS"]

LAYER_CHARS: dict[str, str] = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
# a layout string that unrolls to more characters than this is refused before it is expanded (bad input,
# e.g. `t*1000000000`, must not exhaust memory); the largest published models have a few hundred layers
MAX_EXPANDED_CHARS = 100_000
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_SINGLE = re.compile(r"(.)\*(\d+)")


class LayoutSyntaxError(ValueError):
    """The string is not in megatron-core's layout grammar (megatron-core raises AssertionError there)."""


def _unroll(pattern: re.Pattern[str], text: str) -> str:
    total = len(text)
    for match in pattern.finditer(text):
        total += len(match.group(1)) * (int(match.group(2)) - 1) - (len(match.group(0)) - len(match.group(1)))
        if total > MAX_EXPANDED_CHARS:
            raise LayoutSyntaxError(f"pipeline_model_parallel_layout {text!r} unrolls to more than "
                                    f"{MAX_EXPANDED_CHARS} characters.")
    return pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)


@lru_cache(maxsize=1024)
def parse_stages(text: str) -> tuple[str, ...]:
    """The flat virtual stages of a layout string, each a string of layer characters (`"Et"`, `"tt"`, `"mL"`).

    Raises LayoutSyntaxError with megatron-core's message for a character outside E, L, t, m."""
    unrolled = _unroll(_SINGLE, _unroll(_GROUP, text.replace(",", "")))
    stages = tuple(unrolled.split("|"))
    for stage in stages:
        for char in stage:
            if char not in LAYER_CHARS:
                raise LayoutSyntaxError(
                    f"Invalid layer character: {char} (stage={stage!r}, layout_str={unrolled!r}), known layer "
                    f"characters: {list(LAYER_CHARS)}")
    return stages


def chunk_counts(text: str, char: str = "t") -> tuple[int, ...]:
    """How many `char` layers each virtual stage holds, in chunk order (chunk c on pipeline rank c % PP)."""
    return tuple(stage.count(char) for stage in parse_stages(text))


def layout_from_chunks(decoders: tuple[int, ...] | list[int], mtp_layers: int = 0) -> str:
    """The layout string with `decoders[c]` transformer layers in chunk c, the embedding first and
    `mtp_layers` MTP layers and the loss last (megatron-core's rules, `validate_layer_layout`)."""
    stages = ["t" * n for n in decoders]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp_layers + "L"
    return compress(stages)


def balanced_layout(num_layers: int, pp: int, vpp: int, mtp_layers: int = 0, min_slots: int = 2) -> str | None:
    """A layout string that spreads the embedding, the layers, the MTP layers and the loss over the PP * VPP
    chunks as evenly as whole slots allow (each counts one slot, as megatron-core's
    `account_for_embedding/loss_in_pipeline_split` count the embedding and the loss): every chunk holds
    floor or ceil of the slots per chunk, the extra slots going to the first chunks, which cycle through the
    pipeline ranks, so that the ranks differ by at most one slot. DeepSeek-V3 (61 layers, 1 MTP layer) on
    PP 8 x VPP 4: 64 slots, 2 per chunk, `Et|(tt|)*30mL`, the published layout.

    None when a chunk would get fewer than `min_slots` slots or the last chunk cannot hold the MTP layers
    and the loss."""
    chunks = pp * vpp
    slots = num_layers + 2 + mtp_layers
    base, extra = divmod(slots, chunks)
    if chunks < 2 or base < min_slots:
        return None
    sizes = [base + (1 if c < extra else 0) for c in range(chunks)]
    decoders = list(sizes)
    decoders[0] -= 1  # the embedding
    decoders[-1] -= 1 + mtp_layers  # the MTP layers and the loss
    if decoders[-1] < 0 or decoders[0] < 0:
        return None
    return layout_from_chunks(decoders, mtp_layers)


def mtp_layout(num_layers: int, pp: int, vpp: int, mtp_layers: int) -> str | None:
    """The layout string of a model with MTP layers as Megatron-Bridge's DeepSeek-V3 recipes split it: the
    embedding costs nothing (a lookup, no GEMM), a decoder layer one, the loss (the output layer's GEMM) one,
    and each MTP layer two (a decoder layer plus its own output layer and loss, megatron-core
    `transformer/multi_token_prediction.py`). Every chunk holds at most `cap` = max(ceil(cost / chunks),
    2 * MTP + 1); the last chunk takes the MTP layers, the loss and decoder layers up to the cap, and the other
    chunks share the rest as evenly as whole layers allow, the lighter ones first (the first also holds the
    embedding). This gives both strings Bridge publishes: 61 layers + 1 MTP layer on PP 8 x VPP 4
    `Et|(tt|)*30mL`, and on PP 4 x VPP 4 (and every 16-chunk split) `Et*4|(t*4|)*14tmL`.

    None when the cost does not divide evenly over the PP * VPP chunks (the space offers a string only then),
    there are under 2 chunks, or a chunk before the last would hold no layer."""
    chunks = pp * vpp
    cost = num_layers + 2 * mtp_layers + 1
    if chunks < 2 or cost % chunks:
        return None
    cap = max(cost // chunks, 2 * mtp_layers + 1)
    last = min(num_layers, cap - 2 * mtp_layers - 1)
    base, extra = divmod(num_layers - last, chunks - 1)
    if base < 1:
        return None
    return layout_from_chunks([base] * (chunks - 1 - extra) + [base + 1] * extra + [last], mtp_layers)


def _encode_stage(stage: str) -> str:
    """Run-length encode one stage: `tttt` -> `t*4` (runs of 3 or more), `tt` stays."""
    out = []
    for match in re.finditer(r"(.)\1*", stage):
        run = match.group(0)
        out.append(f"{run[0]}*{len(run)}" if len(run) >= 3 else run)
    return "".join(out)


def compress(stages: list[str] | tuple[str, ...]) -> str:
    """The shortest-looking string of megatron-core's grammar for these stages: runs of equal middle stages
    become `(stage|)*n`, runs of 3 or more equal layers `t*n`. `parse_stages(compress(s)) == tuple(s)`."""
    encoded = [_encode_stage(s) for s in stages]
    if len(encoded) == 1:
        return encoded[0]
    out = [encoded[0], "|"]
    middle = encoded[1:-1]
    i = 0
    while i < len(middle):
        j = i
        while j < len(middle) and middle[j] == middle[i]:
            j += 1
        run = j - i
        # an empty stage cannot be grouped: `()` does not match megatron-core's group pattern
        if run >= 2 and middle[i]:
            out.append(f"({middle[i]}|)*{run}")
        else:
            out.append("".join(f"{middle[i]}|" for _ in range(run)))
        i = j
    out.append(encoded[-1])
    return "".join(out)


@lru_cache(maxsize=1024)
def canonical(text: str) -> str:
    """The one spelling autotune keeps of a layout string: `compress` of its stages (`Etttt|tttt|tmL` and
    `Et*4|tttt|tmL` are one split). Raises LayoutSyntaxError as `parse_stages` does."""
    return compress(parse_stages(text))
