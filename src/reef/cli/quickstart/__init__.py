"""``reef quickstart``: the whole loop on the embedded defaults, in a directory of its own.

Owns: the applications the quickstart drives — triage (``scenario``: tickets, labels,
grader; ``application``: the OpenAI SDK client that sends traffic and feedback) and,
with ``--task agent``, an order-support agent with tools (``agent``: the shop, its
requests and the outcome grader; ``agent_app``: the SDK client loop) — the
configuration it writes (``workspace``), the pieces of ``reef serve`` it starts and stops
(``stack``), the rounds (``rounds``) and what it reports (``report``).

Does not own: anything it runs. It is a composition root like ``reef serve``: the
gateway, worker, learners and gate are the real ones, configured by the ``reef.yaml``
and recipe it writes; it reads jobs, candidates and releases from the store.
"""

from reef.cli.quickstart.command import quickstart_command

__all__ = ["quickstart_command"]
