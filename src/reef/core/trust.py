"""Trust levels of principals: who may influence what Reef learns and publishes.

Every key has a level (``operator``, ``user`` or ``untrusted``); every feedback row keeps
the level its author had when it was written. Levels are ordered: ``operator`` >
``user`` > ``untrusted``. With no keys configured the one caller is the operator.
"""

from __future__ import annotations

from typing import Literal

Trust = Literal["operator", "user", "untrusted"]
TRUST_LEVELS: tuple[Trust, ...] = ("untrusted", "user", "operator")
OPERATOR: Trust = "operator"


def trust_rank(level: Trust) -> int:
    """0 for ``untrusted``, 1 for ``user``, 2 for ``operator``."""
    return TRUST_LEVELS.index(level)


def at_least(level: Trust, minimum: Trust) -> bool:
    """Whether ``level`` is ``minimum`` or above."""
    return trust_rank(level) >= trust_rank(minimum)


def parse_trust(value: object, where: str) -> Trust:
    """``value`` as a trust level. Raises ``ValueError`` naming ``where`` (e.g. the key)
    and the levels that exist when it is not one."""
    if value not in TRUST_LEVELS:
        raise ValueError(
            f"{where}: unknown trust level {value!r}; use one of operator, user, untrusted"
        )
    return value
