"""The ``reef`` command: the composition root that wires config, store, upstreams and app.

Owns: typer commands, logging setup, mapping ``ReefError`` to exit codes (in ``main``).
Does not own: behaviour; every command calls into the domain packages.
Extend: add a typer command or sub-app in this package and document it in docs/.
"""
