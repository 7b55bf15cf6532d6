"""What serves a request: the ``ServingRelease`` it freezes (``release``), following the
release chain to stage and flip heads (``activation``), and the canary arm of live
traffic (``canary_arm``)."""
