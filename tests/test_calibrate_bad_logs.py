"""`calibrate` on logs that cannot calibrate: one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron_logs import arguments_block, iteration_line, megatron_lm_log

from autotune.ui.cli import main

GBS = 256
ARGS = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_experts": None,
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "world_size": 8, "seq_length": 4096,
        "global_batch_size": GBS, "micro_batch_size": 1, "use_distributed_optimizer": True}  # Llama 3 8B on 8 GPUs
GOOD = megatron_lm_log([3000.0, 1500.0, 1000.0, 1001.0, 999.0, 1000.0, 1000.5], global_batch_size=GBS,
                       arguments=ARGS)


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
    path.write_text(megatron_lm_log([3000.0, 1000.0, 1000.0, 1000.0, 1000.0], global_batch_size=GBS))
    code, err = _calibrate(capsys, path)
    assert code == 2 and "give the layout it ran with --layout" in err
    code, err = _calibrate(capsys, path, "--layout", "tp=1,pp=1,dist_opt=true")
    assert code == 0, err


def test_cut_last_line_is_left_out(capsys, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(_cut(GOOD, "elapsed time per iteration (ms): 1000.5", 20))
    code = main(["calibrate", "--log", str(path), "--model", "llama3-8b"])
    out = capsys.readouterr().out
    assert code == 0 and "cut-off last line left out" in out
