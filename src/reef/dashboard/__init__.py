"""Dashboard: the web UI served at ``/ui``.

Owns (when built — the quickstart and dashboard issue): read-only pages over the admin
API (scenarios, release timelines, candidates, learning curves, recent records, live
status). Empty today; the admin API under ``/reef/...`` already serves the same data.
Does not own: any state; must not import ``learning`` or torch.
Extend: pages read the admin API only.
"""
