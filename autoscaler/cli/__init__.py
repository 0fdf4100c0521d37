"""The ``coadapt`` command (typer): each module parses, calls the layers below and prints.
Nothing imports this package; ``python -m autoscaler.cli`` runs the command."""
