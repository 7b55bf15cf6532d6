"""The admin routes (admin key): experience reads (``experience``), the release chain,
``/reef/status`` and harness downloads (``releases``), candidates and gate runs
(``evaluations``), and the dashboard's reads (``insights``)."""
