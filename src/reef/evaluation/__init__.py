"""Evaluation: suites, scorers, paired comparison, gate decisions, canary.

Owns: eval suites (file suites, regression suites, safety probes — ``suites``,
``safety``), scorers (``Scorer`` plugins in the ``reef.scorers`` entry-point group;
built-ins in ``scorers_builtin``), the paired runner that asks a candidate and the head
the same items through a gateway (``runner``), the statistics and the decision rule
(``stats``, ``decision``), the gate that evaluates a candidate and publishes it per the
recipe's mode (``gate``), the canary monitor (``canary``), the evaluations store
(``results``) and human reports (``report``).
Does not own: serving and canary traffic splitting (``gateway``; never imported here),
learning and experience selection (``learning`` builds the holdout items and calls the
gate), the release chain itself (``releases``).
Extend: a scorer subclasses ``reef.evaluation.scorers.Scorer`` and registers in the
``reef.scorers`` entry-point group; recipes pick it by ``type:``.
"""
