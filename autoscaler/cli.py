"""The ``coadapt`` command line: thin — parse, build objects, call the core, print."""

from __future__ import annotations

import typer

from autoscaler import __version__

app = typer.Typer(
    name="coadapt",
    help=(
        "coadapt: goodput-driven autoscaling of elastic PyTorch training on spot GPU fleets.\n\n"
        "Decides every job's GPUs, placement, batch size and learning-rate scaling each round "
        "(Pollux), and the fleet's size and instance mix by goodput per dollar."
    ),
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """coadapt: goodput-driven autoscaling of elastic PyTorch training on spot GPU fleets."""


@app.command()
def version() -> None:
    """Print coadapt's version."""
    typer.echo(f"coadapt {__version__}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
