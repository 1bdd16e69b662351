"""No dead definitions: vulture (60% confidence and up) finds nothing unused in autotune, search_spaces or trainers.

Uses count wherever they are: the product, the tests, the benches, the notebook generator. What an outside caller
uses (a framework hook, the notebook API, megatron-core's signatures) is listed with its caller in
`tests/dead_code_whitelist.py`; the validity rules, which `search_spaces.rules` looks up by the names in its table,
are added from that table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("autotune/", "search_spaces/", "trainers/")


def test_nothing_is_defined_and_never_used(tmp_path: Path) -> None:
    from search_spaces.rules import RULE_NAMES

    rules = tmp_path / "rule_names.py"
    rules.write_text("".join(f"_.{name}\n" for name in RULE_NAMES))
    vulture = Path(sys.executable).parent / "vulture"
    assert vulture.exists(), f"{vulture} is missing; install the test extras (bash scripts/bootstrap --test)"
    out = subprocess.run([str(vulture), "autotune", "search_spaces", "trainers", "tests", "bench",
                          "examples/make_notebooks.py", "tests/dead_code_whitelist.py", str(rules),
                          "--min-confidence", "60"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    dead = [line for line in out.stdout.splitlines() if line.startswith(PRODUCT)]
    assert out.returncode in (0, 3), out.stderr  # 3: vulture found something; anything else: it could not run
    why = "defined and never used (remove it, or name its outside caller in tests/dead_code_whitelist.py)"
    assert not dead, why + ":\n" + "\n".join(dead)
