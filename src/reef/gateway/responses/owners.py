"""Who may read, continue and delete a stored response: the principal that created it,
or an admin key.

A stored response is a conversation, so it belongs to the key that wrote it, not to its
scenario: another key of the same scenario gets the same 404 as for an unknown id (ids
of others are not confirmed). An admin key may read and delete any response of the
scenarios it may use. With no keys configured every caller is the one anonymous
principal (``key_id`` None), which owns everything stored meanwhile; a response stored
then stays readable, once keys are configured, by admin keys only.
"""

from __future__ import annotations

from reef.experience import ResponseNotFoundError, StoredResponse
from reef.gateway.auth import Principal


def may_use(principal: Principal, stored: StoredResponse) -> bool:
    """Whether ``principal`` may read, continue or delete ``stored``."""
    if principal.scenarios is not None and stored.scenario not in principal.scenarios:
        return False
    return principal.role == "admin" or stored.principal == principal.key_id


def check_owner(principal: Principal, stored: StoredResponse, scenario: str | None) -> None:
    """Raise ``ResponseNotFoundError`` (as for an unknown id, ``scenario`` the one the
    lookup named) unless ``principal`` may use ``stored``."""
    if not may_use(principal, stored):
        raise ResponseNotFoundError(stored.id, scenario)
