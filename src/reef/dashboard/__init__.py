"""Dashboard: the web UI served at ``/ui``.

Owns: the static single-page app under ``static/`` (one HTML shell, vanilla JS modules,
CSS; no build step, no CDN) and ``DashboardFiles``, which serves exactly those files with
a strict Content-Security-Policy. The pages read the admin API (``/reef/...``) with the
admin key the user enters once (kept in ``sessionStorage``): scenarios, release
timelines, candidates with their gate evidence (its provenance, the job's feedback
screening) and harness diff, evaluations item by item, learning curves, recent records
with feedback, a session's trajectory (its turns with their tool calls and results),
quarantined feedback, live status. Its one write is releasing quarantined feedback
(``POST /reef/feedback/{id}/release``).
Does not own: any state or data route (those live in ``reef.gateway``); must not import
``learning`` or torch.
Extend: add a page as ``static/pages/<name>.js`` exporting ``render(params, query)`` and
route it in ``static/app.js``; a page calls the admin API only.
"""

from reef.dashboard.files import DashboardFiles

__all__ = ["DashboardFiles"]
