"""The two value types of the validity rules: a `Violation` and the `Rule` that reports it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["Violation", "Rule", "violation", "STRICTER"]

# appended to the message of a deliberate refusal: megatron-core accepts the layout, autotune does not
STRICTER = "megatron-core would accept this layout; autotune refuses it because"


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One broken rule: its name, the fields it read with their values, and megatron-core's message.

    `stricter` marks a deliberate refusal: megatron-core accepts the layout and the message says why
    autotune does not."""

    rule: str
    fields: Mapping[str, object]
    message: str
    stricter: bool = False

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A named rule, the layout fields it reads (`dp` included) and where megatron-core enforces it."""

    name: str
    reads: frozenset[str]
    source: str
    check: Callable[[Job, Layout], Violation | None]


def violation(rule: str, message: str, *, stricter: bool = False, **fields: object) -> Violation:
    return Violation(rule=rule, fields=fields, message=message, stricter=stricter)
