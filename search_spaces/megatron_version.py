"""Which megatron-core is installed, and whose validity rules `search_spaces.rules` applies.

The installed version is read from the package metadata (`importlib.metadata`; megatron itself is never
imported, which would take seconds). Two rule sets exist, 0.16.1's and 0.19.2's, compared check by check
from their sources in `docs/rules.md`; a release is judged by the newest rule set not newer than it
(0.17 and 0.18 by 0.19.2's: the checks autotune models changed in 0.17.0, Megatron-LM tag core_v0.17.0).
With no megatron-core installed, 0.16.1's rules apply (the release Megatron-Bridge v0.3.1 pins).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import metadata

__all__ = ["RULE_SETS", "DEFAULT_RULE_SET", "installed_version", "rules_version", "rule_set_for", "version_info",
           "version_line"]

RULE_SETS: tuple[str, ...] = ("0.16.1", "0.19.2")
DEFAULT_RULE_SET = "0.16.1"
_DISTRIBUTIONS = ("megatron-core", "megatron_core")


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
    """The rule set (one of RULE_SETS) that judges megatron-core `version`; DEFAULT_RULE_SET for None or a
    version older than every rule set or unreadable."""
    release = _release(version) if version else None
    if release is None:
        return DEFAULT_RULE_SET
    if release >= (0, 17, 0):
        return "0.19.2"
    return DEFAULT_RULE_SET


def rules_version() -> str:
    """The rule set `rules.check` applies by default: the installed megatron-core's."""
    return rule_set_for(installed_version())


def version_info() -> dict[str, object]:
    """What `best.json`, `check --json` and `space` report: the installed version, the rules applied, and a note
    when they are not the same release."""
    installed = installed_version()
    rules = rule_set_for(installed)
    note = None
    if installed is None:
        note = f"megatron-core is not installed; megatron-core {rules}'s rules were applied"
    elif _release(installed) != _release(rules):
        note = (f"megatron-core {installed} is installed; autotune has the rules of {' and '.join(RULE_SETS)} "
                f"and applied megatron-core {rules}'s")
    return {"megatron_core_installed": installed, "megatron_core_rules": rules, "note": note}


def version_line() -> str:
    """One line for `check` and `space`: which megatron-core's rules were applied."""
    info = version_info()
    if info["note"]:
        return f"rules: {info['note']}"
    return f"rules: megatron-core {info['megatron_core_rules']} (installed {info['megatron_core_installed']})"
