"""API-key authentication: keys are kept as sha256 hashes and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from reef.config import ApiKeyConfig
from reef.core.errors import PermissionDeniedError, UnauthenticatedError

Role = Literal["inference", "admin"]


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the key's id (None when auth is off) and what it may do."""

    key_id: str | None
    role: Role
    scenarios: frozenset[str] | None

    def check_scenario(self, scenario: str) -> None:
        """Raise ``PermissionDeniedError`` when this key may not use ``scenario``."""
        if self.scenarios is not None and scenario not in self.scenarios:
            raise PermissionDeniedError(
                f"key {self.key_id!r} may not use scenario {scenario!r}; "
                f"allowed: {sorted(self.scenarios)}"
            )

    def require_admin(self) -> None:
        """Raise ``PermissionDeniedError`` unless this is an admin key."""
        if self.role != "admin":
            raise PermissionDeniedError(f"key {self.key_id!r} is not an admin key")


ANONYMOUS = Principal(key_id=None, role="admin", scenarios=None)


class Authenticator:
    """Resolves the key presented with a request to a ``Principal``."""

    def __init__(self, keys: list[ApiKeyConfig]) -> None:
        self._keys = [(bytes.fromhex(key.sha256 or ""), key) for key in keys]

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self._keys)

    def authenticate(self, request: Request) -> Principal:
        """The request's principal. Raises ``UnauthenticatedError`` when keys are
        configured and none matches (or none was sent)."""
        if not self._keys:
            return ANONYMOUS
        presented = _presented_key(request)
        if presented is None:
            raise UnauthenticatedError(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            )
        digest = hashlib.sha256(presented.encode()).digest()
        match: ApiKeyConfig | None = None
        # Compare against every key so timing does not reveal which prefix matched.
        for stored, key in self._keys:
            if hmac.compare_digest(stored, digest):
                match = key
        if match is None:
            raise UnauthenticatedError("invalid API key")
        scenarios = frozenset(match.scenarios) if match.scenarios is not None else None
        return Principal(key_id=match.id, role=match.role, scenarios=scenarios)


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key else None
