"""What serves a request: the ``ServingRelease`` it freezes (``release``), following the
release chain to stage and flip heads (``activation``), the canary arm of live
traffic (``canary_arm``), and who may pin which release or candidate (``pins``)."""
