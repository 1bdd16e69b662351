"""Communication times: ring collectives, groups that span NVLink domains, and the MoE token dispatchers.

Ranks are laid out tp-cp-ep-dp-pp (TP innermost, megatron-core `parallel_state.py`), so a group of n ranks
spaced `stride` apart spans n * stride consecutive GPUs; it stays on NVLink while that span fits in one NVLink
domain (`ClusterSpec.nvlink_domain`: a node's 8 GPUs on HGX H100/B200, 72 GPUs on a GB200 NVL72 rack).
Link bandwidths are per GPU and direction (`search_spaces/gpus.py`); `Calibration.link_fraction` is the share
of it NCCL's bus bandwidth reaches on large messages.
"""

from __future__ import annotations

from autotune.cost.efficiency import Calibration
from search_spaces.cluster import ClusterSpec, LinkSpec

__all__ = ["ring_collective_s", "group_collective_s", "all_to_all_s", "dispatch_s", "p2p_s"]

BF16 = 2.0


def ring_collective_s(nbytes: float, n: int, link: LinkSpec, cal: Calibration) -> float:
    """Ring all-gather or reduce-scatter of a tensor of `nbytes` over n ranks: (n-1)/n * bytes / bw + (n-1) * latency.

    An all-reduce is two of these (reduce-scatter then all-gather). Patarasuk & Yuan 2009; NCCL docs ("bus bandwidth").
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / (link.bandwidth_bytes_per_s * cal.link_fraction) + (n - 1) * link.latency_s


def group_collective_s(nbytes: float, n: int, stride: int, cluster: ClusterSpec, cal: Calibration) -> float:
    """All-gather or reduce-scatter over n ranks spaced `stride` apart.

    Inside one NVLink domain: a ring on NVLink. Across domains, hierarchical: the k = domain / stride members a
    domain holds first reduce-scatter among themselves on NVLink ((k-1)/k * bytes), then each runs the ring
    between the n/k domains on its own NIC with 1/k of the data; an all-gather is the mirror image. A group with
    one member per domain (k = 1) is a plain ring on the network (Thakur et al. 2005 for the two-phase form; NCCL's
    multi-NIC rings and trees reach the same bound).
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    domain = cluster.nvlink_domain
    if n * stride <= domain:
        return ring_collective_s(nbytes, n, cluster.intra_node, cal)
    k = max(1, min(n, domain // stride))
    domains = max(1, round(n / k))
    return (ring_collective_s(nbytes, k, cluster.intra_node, cal)
            + ring_collective_s(nbytes / k, domains, cluster.inter_node, cal))


def all_to_all_s(nbytes_per_rank: float, n: int, link: LinkSpec, cal: Calibration) -> float:
    """All-to-all where each rank holds `nbytes_per_rank`, keeps 1/n and sends the rest:
    (n-1)/n * bytes / bw + latency."""
    if n <= 1 or nbytes_per_rank <= 0:
        return 0.0
    return (n - 1) / n * nbytes_per_rank / (link.bandwidth_bytes_per_s * cal.link_fraction) + link.latency_s


def dispatch_s(dispatcher: str, tokens: float, topk: int, h: int, tp: int, ep: int, etp: int,
               cluster: ClusterSpec, cal: Calibration) -> float:
    """One token dispatch (or, the same size, one combine) of `tokens` routed tokens per GPU, by dispatcher.

    - `alltoall` (megatron-core `MoEAlltoAllTokenDispatcher`, NCCL all-to-all): every one of the k copies of a
      token travels to its expert's rank; copies to ranks in the same NVLink domain go over NVLink, the rest over
      the network, concurrently: max(remote / network, local / NVLink).
    - `flex` (DeepEP / HybridEP, `MoEFlexTokenDispatcher`): across domains a token crosses the network once per
      distinct remote domain among its k experts (expected distinct domains of k uniform picks over D domains:
      D (1 - (1 - 1/D)^k)), then fans out over NVLink; inside a domain like alltoall.
    - `allgather` (`MoEAllGatherTokenDispatcher`): every rank all-gathers all tokens of its TP x EP group
      (T_r h each) and keeps those of its experts: an all-gather of tp * ep * T_r * h bytes.
    With ETP > 1 the copies are all-gathered over the expert-TP group too (reduce-scattered in the combine).
    """
    if tokens <= 0 or (ep <= 1 and etp <= 1):
        return 0.0
    copy_bytes = tokens * topk * BF16 * h
    etp_s = group_collective_s(copy_bytes * etp, etp, 1, cluster, cal) if etp > 1 else 0.0
    if ep <= 1:
        return etp_s
    if dispatcher == "allgather":
        group = tp * ep
        return group_collective_s(tokens * BF16 * h * group, group, 1, cluster, cal) + etp_s
    span = ep * etp
    domain = cluster.nvlink_domain
    intra, inter = cluster.intra_node, cluster.inter_node
    if span <= domain:
        return all_to_all_s(copy_bytes, ep, intra, cal) + etp_s
    per_domain = max(1, domain // etp)  # EP ranks sharing one NVLink domain
    domains = ep / per_domain
    local = copy_bytes * (per_domain - 1) / ep
    if dispatcher == "flex":
        remote_domains = domains * (1.0 - (1.0 - 1.0 / domains) ** topk) * (domains - 1) / domains
        remote = tokens * remote_domains * BF16 * h
        local = copy_bytes * (1.0 - 1.0 / ep)  # DeepEP forwards every copy to its final GPU over NVLink
    else:
        remote = copy_bytes * (ep - per_domain) / ep
    return max(remote / (inter.bandwidth_bytes_per_s * cal.link_fraction),
               local / (intra.bandwidth_bytes_per_s * cal.link_fraction)) + inter.latency_s + etp_s


def p2p_s(nbytes: float, link: LinkSpec, cal: Calibration) -> float:
    """One pipeline send or receive of `nbytes` (Narayanan et al. 2021 Sec. 4.1)."""
    return nbytes / (link.bandwidth_bytes_per_s * cal.link_fraction) + link.latency_s
