"""`calibrate` on logs that cannot calibrate: one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron_logs import arguments_block, iteration_line, logged_tflops, megatron_lm_log

from autotune.ui.api import make_job
from autotune.ui.cli import main

GBS = 256
ARGS = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_experts": None,
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "world_size": 8, "seq_length": 4096,
        "global_batch_size": GBS, "micro_batch_size": 1, "use_distributed_optimizer": True}  # Llama 3 8B on 8 GPUs
STEP_MS = 14000.0  # 9,362 tokens/s per GPU: what 8 H100s give Llama 3 8B at BF16, about 47% MFU
JOB = make_job("llama3-8b", nodes=1, seq_length=4096, global_batch_size=GBS)
TFLOPS = logged_tflops(JOB, STEP_MS / 1000)  # what Megatron-LM logs for that step
STEPS = [3 * STEP_MS, 1.5 * STEP_MS, STEP_MS, STEP_MS + 1, STEP_MS - 1, STEP_MS, STEP_MS + 0.5]
GOOD = megatron_lm_log(STEPS, global_batch_size=GBS, arguments=ARGS, tflops=TFLOPS)


def _cut(text: str, marker: str, keep: int = 0) -> str:
    return text[:text.index(marker) + keep]


BAD = {
    "truncated inside the arguments block": (_cut(GOOD, "  seq_length"), "ends inside its arguments block"),
    "truncated in its first iteration line": (_cut(GOOD, "elapsed time", 5), "truncated"),
    "no iteration lines": ("> building GPT model ...\n" + arguments_block(ARGS), "no Megatron iteration line"),
    "empty": ("", "no Megatron iteration line"),
    "NaN time": (GOOD + iteration_line(8, 8, float("nan"), global_batch_size=GBS) + "\n", "nan ms"),
    "inf time": (GOOD + iteration_line(8, 8, float("inf"), global_batch_size=GBS) + "\n", "inf ms"),
    "another model": (GOOD.replace("4096\n", "8192\n", 1), "another model"),
    "another layout": (GOOD.replace(f"tensor_model_parallel_size {'.' * 22} 1",
                                    f"tensor_model_parallel_size {'.' * 22} 2"), "tensor_model_parallel_size 2"),
    "binary garbage": ("\x00\xff\xfe" * 100, "no Megatron iteration line"),
}


def _calibrate(capsys, path: Path, *extra: str) -> tuple[int, str]:
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b", *extra])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_log_is_one_line_exit_2(capsys, tmp_path: Path, kind: str) -> None:
    text, message = BAD[kind]
    path = tmp_path / "run.log"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    code, err = _calibrate(capsys, path, "--layout", "tp=1,pp=1,dist_opt=true")
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_good_log_calibrates(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(GOOD)
    code, err = _calibrate(capsys, path)
    assert code == 0, err


def test_missing_file_and_directory(capsys, tmp_path: Path) -> None:
    code, err = _calibrate(capsys, tmp_path / "nope.log", "--layout", "tp=1")
    assert code == 2 and "no such file" in err
    code, err = _calibrate(capsys, tmp_path, "--layout", "tp=1")
    assert code == 2 and "not a file" in err


def test_flags_that_contradict_the_log(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(GOOD)
    code, err = _calibrate(capsys, path, "--seq-length", "8192")
    assert code == 2 and "seq_length 4096" in err
    code, err = _calibrate(capsys, path, "--nodes", "2")
    assert code == 2 and "world_size 8" in err


def test_log_without_arguments_needs_a_layout(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bridge.log"
    path.write_text(megatron_lm_log([3 * STEP_MS, *[STEP_MS] * 4], global_batch_size=GBS, tflops=TFLOPS,
                                    world_size=8))
    code, err = _calibrate(capsys, path)
    assert code == 2 and "give the layout it ran with --layout" in err
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b", "--layout", "tp=1,pp=1,dist_opt=true"])
    out = capsys.readouterr().out
    assert code == 0
    # no arguments block: its world line gives the 8 GPUs, the rest is assumed, and its logged throughput agrees
    assert "assumed --seq-length 4096, --precision bf16 (its logged" in out.replace("\n", " ")


def test_cut_last_line_is_left_out(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(_cut(GOOD, f"elapsed time per iteration (ms): {STEP_MS + 0.5:.1f}", 20))
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b"])
    out = capsys.readouterr().out
    assert code == 0 and "cut-off last line left out" in out


def _job_log(tmp_path: Path, *, seq: int, logged_seq: int | None, tflops_seq: int | None, step_ms: float = STEP_MS,
             steps: int = 6) -> Path:
    """A Llama 3 8B log on 8 GPUs that ran at `seq` tokens: its arguments block says `logged_seq` (None: left
    out), its iteration lines log the TFLOP/s of a `tflops_seq` run at that step (None: no throughput logged)."""
    from dataclasses import replace

    args = {k: v for k, v in ARGS.items() if k != "seq_length"}
    if logged_seq is not None:
        args["seq_length"] = logged_seq
    tflops = None if tflops_seq is None else logged_tflops(
        replace(JOB, training=replace(JOB.training, seq_length=tflops_seq)), step_ms / 1000)
    path = tmp_path / f"run-{seq}.log"
    path.write_text(megatron_lm_log([3 * step_ms, *[step_ms] * (steps - 1)], global_batch_size=GBS, arguments=args,
                                    tflops=tflops))
    return path


def test_a_log_that_does_not_say_its_sequence_is_checked_by_its_throughput(capsys, tmp_path: Path) -> None:
    # issue 46: a seq-8192 run's log without --seq-length was fitted at 4096 (compute x0.545, at its bound);
    # its logged TFLOP/s says 8192: refused with one line naming the sequence length that fits
    path = _job_log(tmp_path, seq=8192, logged_seq=None, tflops_seq=8192, step_ms=2 * STEP_MS)
    code, err = _calibrate(capsys, path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "assumed: --seq-length 4096" in err and "fits --seq-length 8192" in err
    code, err = _calibrate(capsys, path, "--seq-length", "8192")
    assert code == 0, err
    # the same log without a logged throughput cannot be checked: calibrated, with a warning of what was assumed
    bare = _job_log(tmp_path, seq=8192, logged_seq=None, tflops_seq=None, step_ms=2 * STEP_MS)
    code = main(["calibrate", "--log", str(bare), "--model", "llama3-8b"])
    out = capsys.readouterr().out
    assert code == 0 and "warning: " in out and "assumed --seq-length 4096" in out and "--log-throughput" in out


def test_an_impossible_throughput_is_refused(capsys, tmp_path: Path) -> None:
    # a step 3x faster than the GPU's peak allows at the job the log says (the job must be another)
    fast = _job_log(tmp_path, seq=4096, logged_seq=4096, tflops_seq=None, step_ms=STEP_MS / 3)
    code, err = _calibrate(capsys, fast)
    assert code == 2 and "above the h100-sxm's 989 TFLOP/s bf16 peak" in err and len(err.strip().splitlines()) == 1
    # a logged 2,000 TFLOP/s per GPU on H100 at BF16
    path = tmp_path / "fast.log"
    path.write_text(megatron_lm_log(STEPS, global_batch_size=GBS, arguments=ARGS, tflops=2000.0))
    code, err = _calibrate(capsys, path)
    assert code == 2 and "it logs 2,000 TFLOP/s per GPU, above" in err


def test_a_contradiction_of_a_job_the_log_states_is_a_warning(capsys, tmp_path: Path) -> None:
    # every setting from the log, but its logged TFLOP/s is twice ours: calibrated, with the disagreement said
    path = _job_log(tmp_path, seq=4096, logged_seq=4096, tflops_seq=8192)
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b", "--precision", "bf16"])
    out = capsys.readouterr().out
    assert code == 0 and "warning: " in out and "Megatron counted this model's FLOPs otherwise" in out


def test_a_fit_from_one_iteration_is_warned(capsys, tmp_path: Path) -> None:
    path = _job_log(tmp_path, seq=4096, logged_seq=4096, tflops_seq=4096, steps=2)
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b", "--precision", "bf16"])
    out = capsys.readouterr().out
    assert code == 0 and "one iteration line" in out


def test_the_world_line_gives_the_gpus_and_cp(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    tflops = logged_tflops(make_job("llama3-8b", nodes=2, seq_length=4096, global_batch_size=GBS), STEP_MS / 1000)
    path.write_text(megatron_lm_log(STEPS, global_batch_size=GBS, tflops=tflops, world_size=16, cp=2))
    code, err = _calibrate(capsys, path, "--layout", "tp=1,pp=1,dist_opt=true")
    assert code == 2 and "`using world size` line says context-parallel size 2" in err
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b", "--layout", "tp=1,pp=1,cp=2,dist_opt=true",
                 "--json"])
    captured = capsys.readouterr()
    import json

    assert code == 0, captured.err
    (logged,) = json.loads(captured.out)["provenance"]["logs"]
    assert logged["nodes"] == 2 and logged["layout"].startswith("tp=1,pp=1,cp=2,")
