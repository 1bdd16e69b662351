"""The one way autotune starts or joins Ray: the search driver, the dashboard, the API and the trainers all call it.

    start_local(num_cpus=2)          # a Ray of this machine only: every port on 127.0.0.1, token auth on
    connect("10.0.0.5:6379")         # an existing cluster, with a timeout and a one-line error
    session(address=None)            # context manager: start or connect, shut down only what it started

Closed by default (issue 14; ShadowRay, CVE-2023-48022):
- A local Ray binds every port to loopback. Ray's servers listen on 127.0.0.1 when the node's IP is
  127.0.0.1 (`GcsServer`, `NodeManager`, `ObjectManager` and `CoreWorker` pass `node_ip_address ==
  "127.0.0.1"` as `listen_to_localhost_only` to `rpc::GrpcServer`; the runtime-env and dashboard agents,
  the metrics export and the dashboard follow the node IP too). On Linux `ray.init` replaces a loopback
  `_node_ip_address` with the machine's routable IP (`services.resolve_ip_for_localhost`) unless Ray's
  single-host switch `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is set (`ray_constants.ENABLE_RAY_CLUSTER`,
  the mode Ray uses on macOS and Windows), so `start_local` sets it around `ray.init`.
- Ray's token authentication stays on (Ray's default for a local cluster; a mode the caller set is kept); the token file
  (`RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`) is created, or tightened, to mode 0600.
- The dashboard, when asked for, listens on 127.0.0.1 unless the caller passes another host.

Lives in `search_spaces` because both `autotune` and `trainers` import it (trainers import nothing of
autotune); Ray is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["LOOPBACK", "start_local", "connect", "session", "check_address", "check_port", "token_path",
           "ensure_token_file", "is_loopback"]

LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT_S = 10.0
SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps the node IP on loopback
AUTH_MODE_ENV = "RAY_AUTH_MODE"
_QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def is_loopback(ip: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1)."""
    import ipaddress

    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def check_port(port: Any, what: str = "port") -> int:
    """A TCP port number 1..65535 (ValueError otherwise)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"`1 <= {what} <= 65535` must hold, but got ({what}={port!r}).")
    return port


def check_address(address: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an `--address`: `auto`, `host:port` or `ray://host:port`. ValueError when malformed."""
    text = address.strip()
    if text == "auto":
        return "auto", "", None
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "gcs", text
    elif scheme != "ray":
        raise ValueError(f"--address must be 'auto', HOST:PORT (the head's GCS) or ray://HOST:PORT (Ray Client), "
                         f"but got {address!r}.")
    host, colon, port_text = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"--address {address!r}: expected HOST:PORT with a numeric port, e.g. 10.0.0.5:6379 "
                         f"or ray://10.0.0.5:10001.")
    return scheme, host, check_port(int(port_text), "the --address port")


def _reachable(host: str, port: int, timeout_s: float) -> str:
    """'' when a TCP connection to host:port opens within timeout_s, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except socket.gaierror as e:
        return f"cannot resolve {host!r} ({e.strerror or e})"
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as e:
        return e.strerror or str(e)


def token_path() -> Path:
    """Where Ray reads its token: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(given) if given else Path.home() / ".ray" / "auth_token"


def ensure_token_file() -> Path | None:
    """With token auth on and no RAY_AUTH_TOKEN in the environment: the token file exists and is 0600."""
    if os.environ.get(AUTH_MODE_ENV, "token").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # 256 bits, as `ray get-auth-token --generate`
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o600)
    return path


def _prepare_environment() -> None:
    # RAY_AUTH_MODE is left as the caller set it: unset, Ray (2.59 and later) turns token auth on for a new
    # local cluster itself (`enable_token_auth_by_default`, which also refreshes Ray's cached config).
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    ensure_token_file()


@contextlib.contextmanager
def _single_host() -> Iterator[None]:
    """Ray's single-host mode while `ray.init` starts the local processes (see the module docstring)."""
    before = os.environ.get(SINGLE_HOST_ENV)
    os.environ[SINGLE_HOST_ENV] = "0"
    import ray._private.ray_constants as constants  # read at import: set the attribute too

    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved
        if before is None:
            os.environ.pop(SINGLE_HOST_ENV, None)
        else:
            os.environ[SINGLE_HOST_ENV] = before


def start_local(*, num_cpus: int | None = None, include_dashboard: bool = False, dashboard_host: str = LOOPBACK,
                dashboard_port: int | None = None, temp_dir: str | None = None, namespace: str | None = None,
                job_config: Any = None, log_to_driver: bool = False, logging_level: int = logging.ERROR,
                resources: dict[str, float] | None = None) -> Any:
    """Start a Ray of this machine only (every port on 127.0.0.1, token auth on) and connect to it."""
    if dashboard_port is not None:
        check_port(dashboard_port, "dashboard_port")
    _prepare_environment()
    kwargs: dict[str, Any] = {"num_cpus": num_cpus or os.cpu_count() or 2, "include_dashboard": include_dashboard,
                              "dashboard_host": dashboard_host, "log_to_driver": log_to_driver,
                              "logging_level": logging_level, "configure_logging": True,
                              "_node_ip_address": LOOPBACK}
    optional = {"dashboard_port": dashboard_port, "_temp_dir": temp_dir, "namespace": namespace,
                "job_config": job_config, "resources": resources}
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    import ray

    with _single_host():
        return ray.init(**kwargs)



def connect(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S, namespace: str | None = None,
            job_config: Any = None, log_to_driver: bool = False, logging_level: int = logging.ERROR) -> Any:
    """Join an existing Ray cluster; ValueError with one line when the address is malformed or unreachable."""
    scheme, host, port = check_address(address)
    if scheme == "auto":
        found = _resolve_auto()
        try:
            return connect(found, timeout_s=timeout_s, namespace=namespace, job_config=job_config,
                           log_to_driver=log_to_driver, logging_level=logging_level)
        except ValueError as e:
            raise ValueError(f"--address auto (the cluster recorded on this machine): {e}") from None
    if scheme != "auto":
        why = _reachable(host, port, timeout_s)  # type: ignore[arg-type]
        if why:
            raise ValueError(f"--address {address}: cannot reach a Ray {'client server' if scheme == 'ray' else 'head'}"
                             f" at {host}:{port}: {why}.")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    kwargs: dict[str, Any] = {"log_to_driver": log_to_driver, "logging_level": logging_level, "configure_logging": True}
    kwargs.update({k: v for k, v in {"namespace": namespace, "job_config": job_config}.items() if v is not None})
    # A head on loopback is a cluster of this machine only: Ray would otherwise rewrite 127.0.0.1 to the
    # machine's routable IP (where nothing listens) before connecting.
    single_host = _single_host() if scheme == "gcs" and is_loopback(host) else contextlib.nullcontext()
    try:
        with single_host:
            return ray.init(address=address.strip(), **kwargs)
    except (ConnectionError, TimeoutError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"--address {address}: could not join the Ray cluster: {first}") from None
    except Exception as e:  # Ray's own errors (AuthenticationError, RaySystemError...)
        if type(e).__module__.startswith("ray"):
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"--address {address}: could not join the Ray cluster: {first}") from None
        raise


def _resolve_auto() -> str:
    """`auto`: RAY_ADDRESS, else the cluster `ray start` recorded on this machine (Ray's own look-up, without
    its last resort of joining any gcs_server process it finds running, which may be another user's)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as e:
        raise ValueError(f"--address auto: {' '.join(str(e).split())}") from None
    if not found:
        raise ValueError("--address auto: no running Ray cluster was found on this machine; start one with "
                         "`ray start --head` or give HOST:PORT.")
    return found


@contextlib.contextmanager
def session(*, address: str | None = None, **local: Any) -> Iterator[bool]:
    """Ray for the duration of the block: joined when this process is connected already, else connected to
    `address`, else a local one. Yields whether this call started it; shuts down only what it started."""
    import ray

    started = False
    if not ray.is_initialized():
        if address:
            connect(address, **{k: v for k, v in local.items() if k in ("namespace", "job_config", "log_to_driver",
                                                                          "logging_level")})
        else:
            start_local(**local)
        started = True
    try:
        yield started
    finally:
        if started:
            ray.shutdown()
