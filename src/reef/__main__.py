"""``python -m reef`` runs the ``reef`` command."""

from reef.cli.main import main

main()
