"""The quickstart: the whole loop on the embedded defaults, in a directory of its own.

A demo, not a part of the product: ``reef quickstart`` (``reef.cli.quickstart``) is a
thin entry point that imports this package only when the command runs, and no other part
of Reef imports it.

Owns: the applications the quickstart drives — triage (``scenario``: tickets, labels,
grader; ``application``: the OpenAI SDK client that sends traffic and feedback) and,
with ``--task agent``, an order-support agent with tools (``agent``: the shop, its
requests and the outcome grader; ``agent_app``: the SDK client loop) — the check of its
options and requirements (``launch``), the configuration it writes (``workspace``), the
pieces of ``reef serve`` it starts and stops (``stack``), the rounds (``rounds``) and
what it reports (``report``).

Does not own: anything it runs. It is a composition root like ``reef serve``: the
gateway, worker, learners and gate are the real ones, configured by the ``reef.yaml``
and recipe it writes; it reads jobs, candidates and releases from the store. It starts
the engine the way ``reef serve`` does (``reef.cli.local_engine``).

Extend: a new demo application is a module here with its generator and grader, a
``Plan`` in ``session`` and a value of ``--task``.
"""

from reef.quickstart.launch import GivenOptions, start_quickstart

__all__ = ["GivenOptions", "start_quickstart"]
