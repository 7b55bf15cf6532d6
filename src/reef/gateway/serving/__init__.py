"""What serves a request: the ``ServingRelease`` it freezes (``release``), following the
release chain to stage and flip heads (``activation``), the canary arm of live
traffic (``canary_arm``), who may pin which release or candidate (``pins``), and holding
loaded weights to their fingerprints (``verify``)."""
