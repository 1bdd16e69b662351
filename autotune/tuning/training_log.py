"""Megatron-LM and Megatron-Bridge training logs: the iteration lines, the arguments block, the memory reports.

Both print one line per `log_interval` iterations (Megatron-LM `megatron/training/training.py::training_log`,
Megatron-Bridge `src/megatron/bridge/training/utils/train_utils.py::training_log`):

     [2026-01-02 10:11:12.123456] iteration       20/     100 | consumed samples:         5120 | elapsed time per
     iteration (ms): 8123.4 | throughput per GPU (TFLOP/s/GPU): 412.3 | learning rate: 1.000000E-04 | global batch
     size:   256 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |
     number of nan iterations:   0 |

(one line each; the time is the mean over the iterations since the previous line; the throughput only with
`--log-throughput`). Megatron-LM prints its arguments first (`megatron/training/arguments.py::_print_args`):

    ------------------------ arguments ------------------------
      tensor_model_parallel_size ...................... 2
    -------------------- end of arguments ---------------------

and its world and context-parallel sizes (`validate_args`: `using world size: 64, data-parallel size: 2,
context-parallel size: 1, ...`), which count where the block does not say them, and
`megatron/training/utils/common_utils.py::report_memory` the memory of a rank
(`[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved:
...`). Lines may carry a launcher's prefix (`0: `, `[default0]:`): the patterns are searched, not anchored.

Megatron-Bridge prints no arguments block; it prints its config's values that differ from megatron-core's defaults
(`src/megatron/bridge/training/config.py::ConfigContainer.log_non_default_values`, at setup):

    Configuration Summary (Non-Default Values vs Megatron Core)
    ======================================================================
    [model] Non-default values (vs Mcore TransformerConfig):
      tensor_model_parallel_size: 4  (Mcore default: 1)
    ...
    [train]:
      global_batch_size: 256
    ======================================================================

The values of its `[model]`, `[ddp]`, `[train]` and `[dataset]` sections join the arguments under Megatron-LM's
names (`num_moe_experts` is `num_experts`, the dataset's `sequence_length` is `seq_length`); a field it leaves out
is at megatron-core's default, as a layout field left out is.

`read_log(path)` reads one; `steady_step_s(log)` is the median step time once the warm-up is dropped (the first
line, every line up to iteration `WARMUP_ITERATIONS`, then any line more than `OUTLIER` from the median of the
rest: a checkpoint save, an evaluation). A log that cannot calibrate (missing, no iteration line, truncated, a
NaN or inf time) is a ValueError of one line naming the file.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TrainingLog", "read_log", "parse_log", "steady_step_s", "WARMUP_ITERATIONS", "OUTLIER"]

WARMUP_ITERATIONS = 3  # lines up to this iteration include compilation, allocator growth, NCCL setup
OUTLIER = 0.25  # a line more than 25% from the median of the steady lines is an outlier (checkpoint, eval)
MAX_LOG_BYTES = 1 << 30

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([^\s|]+)\s*\|")
_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([^\s|]+)\s*\|")
_BATCH = re.compile(r"global batch size:\s*(\d+)\s*\|")
_MEMORY = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*([\d.]+)\s*\|\s*max allocated:\s*([\d.]+)\s*\|\s*"
                     r"reserved:\s*([\d.]+)\s*\|\s*max reserved:\s*([\d.]+)")
# Megatron-LM `arguments.py::validate_args`: "using world size: 64, data-parallel size: 2, context-parallel size: 1"
_WORLD = re.compile(r"using world size:\s*(\d+),.*?context-parallel size:\s*(\d+)")
_ARGS_START = re.compile(r"-{3,} arguments -{3,}")
_ARGS_END = re.compile(r"-{3,} end of arguments -{3,}")
_ARG = re.compile(r"(?:^|\s)([A-Za-z_]\w*) \.+ (.*?)\s*$")
_BRIDGE_START = re.compile(r"Configuration Summary \(Non-Default Values vs Megatron Core\)")
_BRIDGE_RULE = re.compile(r"(?:^|[\s:])={10,}\s*$")  # after a launcher's prefix too (`[default0]:====`)
# the summary's sections (ConfigContainer.log_non_default_values), named so that a launcher's `[default0]:` is none
_BRIDGE_SECTION = re.compile(r"(?:^|[\s:])\[(optimizer|ddp|model|train|validation|scheduler|dataset|checkpoint|"
                             r"logger|tokenizer|rng)\](?: Non-default values \(vs Mcore \w+\))?:\s*$")
_BRIDGE_VALUE = re.compile(r"(?:^|\s)([a-z_][a-z0-9_]*): (.*?)(?:\s{2}\(Mcore default: .*\))?\s*$")
BRIDGE_SECTIONS = ("model", "ddp", "train", "dataset")  # where the layout, model and batch fields are
BRIDGE_NAMES = {"num_moe_experts": "num_experts", "sequence_length": "seq_length"}  # Bridge field -> Megatron-LM arg


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingLog:
    """What one log says: its iteration lines, its arguments (Megatron-LM), its memory reports."""

    path: str
    iterations: tuple[tuple[int, float], ...]  # (iteration, elapsed ms per iteration), in log order
    tflops_per_gpu: tuple[float, ...] = ()  # what the log printed, where it did (`--log-throughput`)
    global_batch_size: int | None = None  # the iteration lines' `global batch size`
    arguments: tuple[tuple[str, str], ...] = ()  # Megatron-LM's arguments block, as printed
    max_allocated_mb: float | None = None  # the largest `max allocated` of the memory reports
    cut_line: bool = False  # the last iteration line was cut off (and left out)
    world_size: int | None = None  # the `using world size: ...` line's
    context_parallel_size: int | None = None  # and its context-parallel size

    def argument(self, name: str) -> str | None:
        return dict(self.arguments).get(name)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_log(path: str | Path) -> TrainingLog:
    """Read and parse the log at `path` (ValueError of one line when it cannot calibrate; module docstring)."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--log {path}: no such file.")
    if not p.is_file():
        raise ValueError(f"--log {path}: not a file; give the training job's log file.")
    try:
        if p.stat().st_size > MAX_LOG_BYTES:
            raise ValueError(f"--log {path}: larger than {MAX_LOG_BYTES >> 30} GiB; give the log of one run.")
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"--log {path}: cannot be read ({e.strerror or e}).") from None
    return parse_log(text, path=str(path))


def parse_log(text: str, *, path: str = "<log>") -> TrainingLog:
    """The log's text, parsed (module docstring); ValueError names `path`."""
    iterations: list[tuple[int, float]] = []
    tflops: list[float] = []
    arguments: dict[str, str] = {}
    allocated: list[float] = []
    batch: int | None = None
    in_args = args_seen = cut = False
    bridge: dict[str, str] = {}
    section: str | None = None  # inside Bridge's configuration summary: its current section ("" before the first)
    rules = 0
    world: dict[str, int] = {}
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if section is not None:
            if _BRIDGE_RULE.search(line):
                rules += 1
                if rules > 1:  # the title's own rule is the first
                    section = None
                continue
            if (head := _BRIDGE_SECTION.search(line)) is not None:
                section = head.group(1)
                continue
            if section in BRIDGE_SECTIONS and (v := _BRIDGE_VALUE.search(line)) is not None:
                bridge.setdefault(BRIDGE_NAMES.get(v.group(1), v.group(1)), _bridge_value(v.group(2)))
            continue
        if not bridge and _BRIDGE_START.search(line):
            section, rules = "", 0
            continue
        if in_args:
            if _ARGS_END.search(line):
                in_args = False
                continue
            m = _ARG.search(line)
            if m:
                arguments.setdefault(m.group(1), m.group(2))
            continue
        if not args_seen and _ARGS_START.search(line):
            in_args = args_seen = True
            continue
        if not world and (w := _WORLD.search(line)) is not None:
            world = {"world_size": int(w.group(1)), "context_parallel_size": int(w.group(2))}
            continue
        if (mem := _MEMORY.search(line)) is not None:
            allocated.append(float(mem.group(2)))
            continue
        it = _ITERATION.search(line)
        if it is None or "consumed samples" not in line and "elapsed time" not in line:
            continue
        elapsed = _ELAPSED.search(line)
        if elapsed is None:
            if not any(s.strip() for s in lines[n + 1:]):
                cut = True  # the file ends inside this line
                continue
            raise ValueError(f"--log {path}: line {n + 1} is an iteration line without `elapsed time per iteration "
                             f"(ms): T |`; give the log Megatron-LM or Megatron-Bridge printed, unedited.")
        ms = _number(elapsed.group(1))
        if not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"--log {path}: iteration {it.group(1)}'s elapsed time is {elapsed.group(1)} ms (line "
                             f"{n + 1}); a log with NaN, inf or non-positive step times cannot calibrate.")
        iterations.append((int(it.group(1)), ms))
        if (tf := _TFLOPS.search(line)) is not None and math.isfinite(_number(tf.group(1))):
            tflops.append(_number(tf.group(1)))
        if (b := _BATCH.search(line)) is not None:
            batch = int(b.group(1))
    if in_args or section is not None:
        what = "its arguments block" if in_args else "Megatron-Bridge's configuration summary"
        raise ValueError(f"--log {path}: ends inside {what} (truncated); give the whole log.")
    for name, value in bridge.items():  # Megatron-LM's block, where a log has both, wins
        arguments.setdefault(name, value)
    if not iterations:
        what = ("ends before its first complete iteration line (truncated)" if cut else
                "has no Megatron iteration line (`iteration N/ M | ... elapsed time per iteration (ms): T |`)")
        raise ValueError(f"--log {path}: {what}; give the stdout log of a Megatron-LM or Megatron-Bridge training "
                         f"run that logged some iterations.")
    return TrainingLog(path=path, iterations=tuple(iterations), tflops_per_gpu=tuple(tflops), global_batch_size=batch,
                       arguments=tuple(arguments.items()), max_allocated_mb=max(allocated, default=None), cut_line=cut,
                       world_size=world.get("world_size"), context_parallel_size=world.get("context_parallel_size"))


def _bridge_value(text: str) -> str:
    """A Bridge summary value (a Python repr) as Megatron-LM's block prints it: quotes dropped (`'selective'`)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def steady_step_s(log: TrainingLog) -> tuple[float, int]:
    """(median step time in seconds, iteration lines it is the median of), warm-up and outliers left out."""
    lines = list(log.iterations)
    steady = [ms for i, (it, ms) in enumerate(lines) if i > 0 and it > WARMUP_ITERATIONS]
    if not steady:  # a log of warm-up lines only: the last line is the best there is
        steady = [lines[-1][1]]
    mid = statistics.median(steady)
    kept = [ms for ms in steady if abs(ms / mid - 1.0) <= OUTLIER] or steady
    return statistics.median(kept) / 1000.0, len(kept)
