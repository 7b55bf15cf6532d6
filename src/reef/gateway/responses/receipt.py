"""The receipt a Responses stream's terminal event carries (``x_reef``), made of the
receipt headers the other APIs answer with."""

from __future__ import annotations

# The receipt headers, as the keys of a Responses stream's terminal ``x_reef`` object.
_RECEIPT_KEYS = {
    "x-reef-record-id": "record_id",
    "x-reef-session-id": "session_id",
    "x-reef-release-id": "release_id",
}


def stream_receipt(headers: dict[str, str]) -> dict[str, str]:
    """The receipt among a response's ``headers`` as the ``x_reef`` object that a
    Responses stream's terminal event (``response.completed``, ``response.incomplete``,
    ``response.failed``) carries beside ``response``: ``record_id`` (captured exchanges
    only), ``session_id``, ``release_id``. An extra field of the event, which the
    official SDKs keep (``event.x_reef``) and the response object never holds."""
    return {key: headers[name] for name, key in _RECEIPT_KEYS.items() if name in headers}
