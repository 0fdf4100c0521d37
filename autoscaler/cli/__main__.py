"""``python -m autoscaler.cli``: the ``coadapt`` command."""

from autoscaler.cli.main import main

main()
