"""The torch.distributed rendezvous of a worker group, closed to the network: rank 0's TCPStore listens on a socket
bound to its own Ray node IP (127.0.0.1 on a local Ray; `TCPStore(master_listen_fd=...)`), never on all interfaces
as torch's default does, and on a loopback node gloo and NCCL bind their sockets to the loopback interface
(`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`). The worker pool and the fresh Ray Train workers both use it.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["open_store", "join_process_group", "node_ip"]


def _loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 (`lo` on Linux), or None."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
            return name
    return None


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _is_loopback(ip: str) -> bool:
    from search_spaces.ray_session import is_loopback

    return is_loopback(ip)


def open_store(timeout_s: float) -> tuple[Any, str, int]:
    """Rank 0's TCPStore, listening on this node's Ray IP only (a socket bound there, handed to torch)."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    addr = node_ip()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addr, 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    store = dist.TCPStore(addr, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach(),
                          timeout=timedelta(seconds=timeout_s))
    return store, addr, port


def join_process_group(store: Any, addr: str, port: int, rank: int, world_size: int, backend: str,
                       timeout_s: float) -> Any:
    """torch.distributed on the store of rank 0 (created here for the other ranks); loopback sockets on a loopback
    node."""
    from datetime import timedelta

    import torch.distributed as dist

    if _is_loopback(node_ip()):
        interface = _loopback_interface()
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
            os.environ["NCCL_SOCKET_IFNAME"] = interface
    if store is None:
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return store
