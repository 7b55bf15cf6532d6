"""Evaluation: suites, scorers, paired comparison, gate decisions, canary.

Owns (when built — the evaluation-gate issue): eval suites, scorer plugins
(``reef.scorers`` entry points), the paired runner, the publish/reject decision and
canary traffic splitting. Empty today: learned candidates wait in the release chain as
``pending``; nothing publishes them until this gate exists.
Does not own: serving (``gateway``; never imported here), learning, the chain itself.
Extend: scorers will subclass a small ``Scorer`` ABC registered by entry point.
"""
