"""A cluster's calibration: a few named, bounded factors on `DEFAULT_CALIBRATION`, read from and written to YAML.

`python -m autotune calibrate` fits them on the user's own training logs (`autotune/tuning/calibrate.py`); every verb
takes the file with `--calibration FILE` and applies it with `apply_factors`. A factor multiplies constants of one
GPU generation (`gpu_arch`) of the calibration it is applied to:

- `compute`: the generation's GEMM fractions of the precisions the logs ran (`precisions`: BF16, FP8 (every
  recipe), NVFP4; all of them for a file that names none) and its attention fraction: an FP8 log says nothing of
  the BF16 GEMMs;
- `network`: `link_fraction`, the share of link bandwidth NCCL reaches (every link, intra- and inter-node);
- `host`: the generation's `host_op_s`, the host time of one framework-level op.

Each is bounded to `FACTOR_BOUNDS`, and a fraction of peak never above 1 (`compute` and `network` stop where the
largest fraction they scale reaches 1). The file (`autotune_calibration: 1`):

    autotune_calibration: 1
    gpu_arch: hopper
    factors: {compute: 0.93, network: 0.81, host: 1.0}
    precisions: [fp8]             # the GEMM precisions `compute` scales
    at_bound: []                  # factors a bound held
    graphs: [none]                # the logs' CUDA-graph settings: credited on this generation from now on
    source: logs                  # logs | megatron-gpu (a search's or a profile's GPU runs) | megatron-cpu-proxy
    provenance: {date: ..., autotune_version: ..., logs: [{path, step_time_s, layout, error_before, error_after, ...}]}

`read_calibration` validates it (a ValueError of one line naming the file and the field). A file measured on the CPU
proxy (`source: megatron-cpu-proxy`, what `calibrate --profile` writes on a machine without GPUs) is readable but no
verb applies it: its factors describe gloo and CPU kernels, not a GPU cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.cost.efficiency import DEFAULT_CALIBRATION, ArchFractions, Calibration
from search_spaces.cluster import ARCHES, GPUSpec
from search_spaces.layout import CUDA_GRAPH_CHOICES
from search_spaces.training import PRECISION_CHOICES

__all__ = ["FACTORS", "FACTOR_BOUNDS", "FORMAT_VERSION", "PROXY_SOURCE", "SOURCES", "CalibrationFile", "apply_factors",
           "describe_summary",
           "factor_bounds",
           "read_calibration", "write_calibration"]

FACTORS = ("compute", "network", "host")
FACTOR_BOUNDS = (0.5, 2.0)  # each factor stays within these (x DEFAULT_CALIBRATION's constant)
FORMAT_VERSION = 1
SOURCES = ("logs", "megatron-gpu", "megatron-cpu-proxy")  # what the factors were fitted on
PROXY_SOURCE = "megatron-cpu-proxy"


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationFile:
    """The factors of one GPU generation and where they came from (`provenance`, plain data as in the file)."""

    gpu_arch: str
    factors: tuple[tuple[str, float], ...]  # (name in FACTORS, value), every name once
    at_bound: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()  # the GEMM precisions `compute` scales (the logs'); () every precision
    graphs: tuple[str, ...] = ()  # the logs' CUDA-graph settings: their saving is credited on this generation
    source: str = "logs"  # one of SOURCES
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    path: str = ""  # where it was read from ("" for one not read from a file)

    def factor(self, name: str) -> float:
        return dict(self.factors).get(name, 1.0)

    def calibration(self, gpu: GPUSpec, base: Calibration = DEFAULT_CALIBRATION) -> Calibration:
        """`base` with the factors applied, for a job on `gpu`; ValueError when `gpu` is of another generation (the
        factors describe this generation's kernels and links only) or when the file was measured on the CPU proxy."""
        if self.source == PROXY_SOURCE:
            raise ValueError(f"--calibration {self.name}: it was profiled on the CPU proxy (gloo, CPU kernels), whose "
                             f"timings are not a GPU cluster's; it shows the profile ran, but no verb applies it. "
                             f"Profile on GPUs (`calibrate --profile` where Ray sees GPUs), or calibrate from a log.")
        if gpu.arch != self.gpu_arch:
            raise ValueError(f"--calibration {self.name}: it was fitted on {self.gpu_arch} GPUs, but this job runs "
                             f"{gpu.name} ({gpu.arch}); calibrate on a log of a {gpu.arch} run, or leave "
                             f"--calibration out.")
        return apply_factors(base.seen_graphs(self.gpu_arch, self.graphs), self.gpu_arch, dict(self.factors),
                             self.precisions)

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else "(unsaved)"

    def describe(self) -> str:
        """One line: `my-cluster.yaml (compute x0.93, network x0.81, host x1.00; fitted on 2 logs; hopper)`."""
        return describe_summary(self.summary())

    def summary(self) -> dict[str, Any]:
        """What a result records of the calibration it used (best.json, search.json, --json)."""
        logs = self.provenance.get("logs")
        return {"file": self.path, "gpu_arch": self.gpu_arch, "precisions": list(self.precisions),
                "source": self.source, "factors": dict(self.factors),
                "at_bound": list(self.at_bound), "logs": len(logs) if isinstance(logs, list) else None}


def describe_summary(summary: dict[str, Any]) -> str:
    """`CalibrationFile.describe` of a recorded `summary()` (search.json, a result's stats)."""
    factors = summary.get("factors") or {}
    at_bound = summary.get("at_bound") or ()
    parts = ", ".join(f"{n} x{float(factors.get(n, 1.0)):.2f}{' (at its bound)' if n in at_bound else ''}"
                      for n in FACTORS)
    logs = summary.get("logs")
    fitted = f"; fitted on {logs} log{'s' if logs != 1 else ''}" if isinstance(logs, int) else ""
    name = Path(summary["file"]).name if summary.get("file") else "(unsaved)"
    scope = " ".join([str(summary.get("gpu_arch")), *(summary.get("precisions") or [])])
    return f"{name} ({parts}{fitted}; {scope})"


def _scaled(f: ArchFractions, precisions: tuple[str, ...]) -> list[float]:
    """The fractions `compute` scales: the attention core's and the GEMMs' of `precisions` (() every one)."""
    every = not precisions
    out = [f.attention]
    if every or "bf16" in precisions:
        out.append(f.gemm_bf16)
    if every or "fp8" in precisions:
        out += [v for _, v in f.gemm_fp8]
    if (every or "fp4" in precisions) and f.gemm_fp4 is not None:
        out.append(f.gemm_fp4)
    return out


def factor_bounds(base: Calibration, arch: str, precisions: tuple[str, ...] = ()) -> dict[str, tuple[float, float]]:
    """(low, high) of each factor: FACTOR_BOUNDS, and no fraction of peak above 1 (compute, network)."""
    low, high = FACTOR_BOUNDS
    compute_top = max(_scaled(dict(base.per_arch)[arch], precisions))
    return {"compute": (low, min(high, 1.0 / compute_top)), "network": (low, min(high, 1.0 / base.link_fraction)),
            "host": (low, high)}


def apply_factors(base: Calibration, arch: str, factors: dict[str, float],
                  precisions: tuple[str, ...] = ()) -> Calibration:
    """`base` with `factors` (FACTORS names, missing ones 1) applied to generation `arch`, `compute` to the GEMMs of
    `precisions` only (() every precision; module docstring)."""
    c, n, h = (float(factors.get(name, 1.0)) for name in FACTORS)

    def on(p: str) -> float:
        return c if not precisions or p in precisions else 1.0

    per_arch = tuple((name, f.scaled(bf16=on("bf16"), fp8=on("fp8"), fp4=on("fp4"), attention=c, host=h)
                      if name == arch else f) for name, f in base.per_arch)
    return replace(base, per_arch=per_arch, link_fraction=base.link_fraction * n)


def _fail(path: str | Path, what: str) -> ValueError:
    return ValueError(f"--calibration {path}: {what}; write it with `python -m autotune calibrate --log ... --output "
                      f"FILE`.")


def read_calibration(path: str | Path) -> CalibrationFile:
    """The calibration file at `path`, validated (module docstring); ValueError of one line otherwise."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--calibration {path}: cannot be read ({getattr(e, 'strerror', None) or e}).") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise _fail(path, f"not YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(data, dict) or data.get("autotune_calibration") != FORMAT_VERSION:
        raise _fail(path, f"not an autotune calibration file (no `autotune_calibration: {FORMAT_VERSION}`)")
    arch = data.get("gpu_arch")
    if arch not in ARCHES or arch not in dict(DEFAULT_CALIBRATION.per_arch):
        raise _fail(path, f"`gpu_arch` must be one of {', '.join(dict(DEFAULT_CALIBRATION.per_arch))}, but got "
                          f"{arch!r}")
    factors = data.get("factors")
    if not isinstance(factors, dict) or not factors or not set(factors) <= set(FACTORS):
        raise _fail(path, f"`factors` must map some of {', '.join(FACTORS)} to numbers, but got {factors!r}"[:300])
    low, high = FACTOR_BOUNDS
    values: list[tuple[str, float]] = []
    for name in FACTORS:
        v = factors.get(name, 1.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not low <= v <= high:
            raise _fail(path, f"`{low} <= factors.{name} <= {high}` must hold, but got {v!r}")
        values.append((name, float(v)))
    at_bound = data.get("at_bound") or []
    if not isinstance(at_bound, list) or not set(at_bound) <= set(FACTORS):
        raise _fail(path, f"`at_bound` must list some of {', '.join(FACTORS)}, but got {at_bound!r}"[:300])
    precisions = data.get("precisions") or []
    if not isinstance(precisions, list) or not set(precisions) <= set(PRECISION_CHOICES):
        raise _fail(path, f"`precisions` must list some of {', '.join(PRECISION_CHOICES)}, but got "
                          f"{precisions!r}"[:300])
    graphs = data.get("graphs") or []
    if not isinstance(graphs, list) or not all(isinstance(g, str) and g in CUDA_GRAPH_CHOICES for g in graphs):
        raise _fail(path, f"`graphs` must list some of {', '.join(CUDA_GRAPH_CHOICES)}, but got {graphs!r}"[:300])
    source = data.get("source", "logs")
    if source not in SOURCES:
        raise _fail(path, f"`source` must be one of {', '.join(SOURCES)}, but got {source!r}"[:300])
    provenance = data.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise _fail(path, "`provenance` must be a mapping")
    return CalibrationFile(gpu_arch=arch, factors=tuple(values), at_bound=tuple(at_bound),
                           precisions=tuple(sorted(precisions)), graphs=tuple(sorted(graphs)), source=source,
                           provenance=provenance, path=str(path))


def write_calibration(path: str | Path, cal: CalibrationFile) -> None:
    """Write `cal` as YAML (atomically: a temporary file renamed over `path`)."""
    import os

    import yaml

    data = {"autotune_calibration": FORMAT_VERSION, "gpu_arch": cal.gpu_arch,
            "factors": {n: round(v, 4) for n, v in cal.factors}, "precisions": list(cal.precisions),
            "at_bound": list(cal.at_bound), "graphs": list(cal.graphs), "source": cal.source,
            "provenance": cal.provenance}
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    os.replace(tmp, target)
