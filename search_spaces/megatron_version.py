"""Which megatron-core a job targets, and whose validity rules and launch lines apply to it.

A job targets one megatron-core release: the one the user's cluster runs (`--megatron-core`, the training spec's
`megatron_core`), by default the installed one, else 0.19.2. Two rule sets exist, 0.16.1's and 0.19.2's, compared
check by check from their sources in `docs/rules.md`; a release is judged by the newest rule set not newer than
it (0.17 and 0.18 by 0.19.2's: the checks autotune models changed in 0.17.0, Megatron-LM tag core_v0.17.0).
Each rule set has its launch targets beside it (`LAUNCH_TARGETS`): the Megatron-Bridge release that pins that
megatron-core and Megatron-LM's matching tag.

The installed version is read from the package metadata (`importlib.metadata`; megatron itself is never
imported, which would take seconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

__all__ = ["RULE_SETS", "DEFAULT_RULE_SET", "LAUNCH_TARGETS", "LaunchTarget", "installed_version", "rules_version",
           "rule_set_for", "megatron_core_choice", "version_info", "version_line"]

RULE_SETS: tuple[str, ...] = ("0.16.1", "0.19.2")
DEFAULT_RULE_SET = "0.19.2"  # the release the package requires (pyproject.toml)
_DISTRIBUTIONS = ("megatron-core", "megatron_core")


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchTarget:
    """What the launch lines of one rule set are written for."""

    bridge: str  # Megatron-Bridge release (its `ConfigContainer` keys)
    megatron_lm: str  # Megatron-LM tag (its `arguments.py` flags)


LAUNCH_TARGETS: dict[str, LaunchTarget] = {
    # Bridge v0.3.1 pins megatron-core 0.16.1; Bridge 0.6.x pins 0.19.x (their package metadata)
    "0.16.1": LaunchTarget(bridge="0.3.1", megatron_lm="core_v0.16.1"),
    "0.19.2": LaunchTarget(bridge="0.6.2", megatron_lm="core_v0.19.2"),
}


def _release(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of a version string like "0.16.1", "0.19.0rc3" or "0.17.0.dev0+abc"."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


@lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed megatron-core's version string, or None when it is not installed."""
    for name in _DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def rule_set_for(version: str | None) -> str:
    """The rule set (one of RULE_SETS) that judges megatron-core `version`: 0.19.2's from 0.17 on, 0.16.1's before;
    DEFAULT_RULE_SET for None or an unreadable version."""
    release = _release(version) if version else None
    if release is None:
        return DEFAULT_RULE_SET
    if release >= (0, 17, 0):
        return "0.19.2"
    return "0.16.1"


def megatron_core_choice(text: str) -> str:
    """The rule set a user's `--megatron-core` names: a 0.16.x or 0.19.x release (the two autotune targets).
    Raises ValueError, naming the choices, for anything else."""
    release = _release(str(text))
    if release is not None and release[:2] in ((0, 16), (0, 19)) and re.fullmatch(r"\s*v?[\d.]+(rc\d+)?\s*", text):
        return rule_set_for(text)
    raise ValueError(f"megatron_core must be a 0.16.x or 0.19.x release (autotune has the rules and launch lines of "
                     f"megatron-core {' and '.join(RULE_SETS)}), but got {text!r}.")


def rules_version() -> str:
    """The rule set a job targets when it does not say: the installed megatron-core's, else DEFAULT_RULE_SET."""
    return rule_set_for(installed_version())


def version_info(rules: str | None = None) -> dict[str, object]:
    """What `best.json`, `check --json` and `space` report: the installed version, the rules applied (`rules`,
    default the installed version's), and a note when they are not the same release."""
    installed = installed_version()
    rules = rules or rule_set_for(installed)
    note = None
    if installed is None:
        note = f"megatron-core is not installed; megatron-core {rules}'s rules were applied"
    elif _release(installed) != _release(rules):
        note = f"megatron-core {installed} is installed; megatron-core {rules}'s rules were applied"
    return {"megatron_core_installed": installed, "megatron_core_rules": rules, "note": note}


def version_line(rules: str | None = None) -> str:
    """One line for `check` and `space`: which megatron-core's rules were applied."""
    info = version_info(rules)
    if info["note"]:
        return f"rules: {info['note']}"
    return f"rules: megatron-core {info['megatron_core_rules']} (installed {info['megatron_core_installed']})"
