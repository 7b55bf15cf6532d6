"""The gateway: OpenAI- and Anthropic-compatible inference, recorded as experience.

Owns: the ASGI app (``create_app``), routes, authentication, capture (turning exchanges
into records), idempotency keys (one upstream call per key, answers replayed from
records), error mapping to HTTP (a failed stream's last event too), metrics.
Does not own: storage (the stores ``create_app`` builds on the ``reef.db.Database`` it is
given: experience, releases, jobs, evaluations; the gateway writes no SQL), talking to
model servers and relaying their streams (``reef.upstream``), learning. It must never
import ``reef.learning``, torch or SQLAlchemy (``tests/architecture``).
Layout: ``routes`` is the route table (every route's access and body, the one place
they are declared), ``auth`` the guard that enforces it, ``browser_policy`` the Host,
Origin and CORS checks every request passes; the inference path is flat (``inference``
routes, which pick a stream's relay; ``capture`` records, ``idempotency``/``replay``,
``body_checks``/``requests`` checks); sub-packages
hold the rest by kind: ``serving`` (what serves a request: releases, activation,
canary), ``responses`` (the Responses API), ``admin`` (admin routes), ``openapi`` (the
self-description).
Extend: a new route is a rule in ``routes.ROUTE_TABLE`` (its access, where its scenario
comes from, whether it takes a body) and a handler that takes a ``GatewayState``, reads
the caller from ``auth.grant_of`` and maps ``ReefError`` through ``reef.gateway.errors``
so every failure has the caller's dialect shape.
"""

from reef.gateway.app import create_app

__all__ = ["create_app"]
