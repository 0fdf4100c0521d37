"""``coadapt tokens rotate user | agent-key | scrape | all``: replace a cluster's secrets without
stopping a job; ``coadapt tokens scrape [--out FILE]``: the scrape token, good for ``GET /metrics``
only, for a Prometheus (thin: parse, call :mod:`autoscaler.controller.credentials`, print).

It rewrites the controller's tokens file (``<state>/tokens.json``), whether or not the
controller runs: a running one reads the file again at its next request. What each rotation
does (the module docstring of :mod:`autoscaler.controller.credentials` says it in full):

* ``user``: a new users' token; the old one is refused at once. No job or agent uses it. A
  cloud controller publishes the new one where it published the old (SSM, Secret Manager).
* ``agent-key``: a new agent key; every agent and report credential made with the old one stays
  valid for ``--grace-s`` seconds, while agents renew theirs at their next heartbeat and hand
  their jobs new report credentials (nothing is relaunched), then is refused.
* ``scrape``: a new scrape token; the old one is refused at once (the scraper needs the new
  one: ``coadapt tokens scrape --out FILE`` writes it).
* ``all``: the users' token and the agent key, and the scrape token when one was issued.

On a shared (PostgreSQL) store give it the store (``--store URL``, or ``COADAPT_STORE_URL``):
the controllers check the store's credentials, so the rotation is made there (one
transaction) and every controller of the store honours it within a second; this machine's
``tokens.json`` gets the new copy, the other machines' running controllers rewrite theirs. A
``tokens.json`` that is a shared store's copy is not rotated without ``--store``.

On a deployed cluster run it on the controller machine (``--state-dir /var/lib/coadapt``): the
copy of the users' token a CLI keeps for a deployed cluster has no agent key to rotate.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autoscaler.cli.common import STORE_URL_FIX, StateDir, StoreUrl, fail, resolve_state_dir

if TYPE_CHECKING:
    from autoscaler.controller.store import Store

WHICH = ("user", "agent-key", "scrape", "all")


def register(app: typer.Typer) -> None:
    """Add ``coadapt tokens`` to the ``coadapt`` app."""
    tokens_app = typer.Typer(
        rich_markup_mode=None,  # plain help: option names whole at 80 columns
        help="The cluster's secrets: the users' token, the agent key, the scrape token.",
        no_args_is_help=True,
    )
    tokens_app.command("rotate")(rotate)
    tokens_app.command("scrape")(scrape)
    app.add_typer(tokens_app, name="tokens")


def rotate(
    which: Annotated[str, typer.Argument(help="What to replace: user, agent-key, scrape or all.")],
    state_dir: StateDir = None,
    grace_s: Annotated[
        float,
        typer.Option(
            help="With agent-key: seconds the previous key's credentials stay valid while agents "
            "and trainers renew (at most 7 days)."
        ),
    ] = 600.0,
    force: Annotated[
        bool,
        typer.Option(
            help="With agent-key: rotate again although the previous key is still honoured "
            "(whoever has not renewed yet is refused)."
        ),
    ] = False,
    store: StoreUrl = None,
) -> None:
    """Replace the users' token, the agent key and/or the scrape token, without stopping a
    job."""
    from autoscaler.controller.credentials import TokenFileError
    from autoscaler.controller.errors import ControllerError
    from autoscaler.errors import InvalidInputError

    if which not in WHICH:
        fail(f"tokens rotate {which}: choose {', '.join(WHICH)}", 2)
    path = resolve_state_dir(state_dir) / "tokens.json"
    _refuse_a_users_copy(path)
    try:
        with _shared_store(store) as shared:
            _rotate(which, path, grace_s, force, shared)
    except InvalidInputError as e:
        fail(str(e), 2)
    except TokenFileError as e:
        fail(str(e))
    except ControllerError as e:  # the shared store
        fail(f"{e}; check --store and that the database is up")


def _rotate(which: str, path: Path, grace_s: float, force: bool, shared: Store | None) -> None:
    """``coadapt tokens rotate``'s rotations, in the tokens file ``path`` or, with
    ``shared``, in the shared store (``path`` getting the copy)."""
    from autoscaler.controller.credentials import (
        load_tokens,
        rotate_agent_key,
        rotate_scrape_token,
        rotate_user_token,
    )

    where = str(path) if shared is None else f"the shared store (this machine's copy: {path})"
    if which in ("agent-key", "all"):  # first: the one that may be refused
        new = rotate_agent_key(path, now_s=time.time(), grace_s=grace_s, force=force, store=shared)
        until = time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(new.previous_agent_key_until_s or 0.0)
        )
        typer.echo(
            f"coadapt: a new agent key is in {where}; credentials of the previous one are "
            f"honoured until {until} ({grace_s:.0f} s): running agents and trainers renew "
            "theirs meanwhile, nothing is restarted"
        )
    if which in ("user", "all"):
        rotate_user_token(path, store=shared)
        typer.echo(f"coadapt: a new users' token is in {where}; the old one is refused from now on")
    if which == "scrape" or (which == "all" and load_tokens(path).scrape is not None):
        rotate_scrape_token(path, store=shared)
        typer.echo(
            f"coadapt: a new scrape token is in {where}; the old one is refused from now on "
            f"(give the scraper the new one: coadapt tokens scrape --out FILE)"
        )


@contextlib.contextmanager
def _shared_store(url: str | None) -> Iterator[Store | None]:
    """The shared store named by ``--store`` (``None`` without it), closed after."""
    if url is None:
        yield None
        return
    from autoscaler.controller.store import Store
    from autoscaler.controller.store.postgres import is_postgres_url
    from coadapt_common.clock import SystemClock

    if not is_postgres_url(url):
        fail(STORE_URL_FIX, 2)
    store = Store.open(url, SystemClock())
    try:
        yield store
    finally:
        store.close()


def scrape(
    state_dir: StateDir = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write the token to this file (0600, the token alone: a Prometheus "
            "credentials_file) instead of printing it."
        ),
    ] = None,
    store: StoreUrl = None,
) -> None:
    """The scrape token: good for GET /metrics only (made on its first issue, the same after)."""
    from autoscaler.controller.credentials import (
        TokenFileError,
        issue_scrape_token,
        write_secret_file,
    )
    from autoscaler.controller.errors import ControllerError

    path = resolve_state_dir(state_dir) / "tokens.json"
    _refuse_a_users_copy(path)
    try:
        with _shared_store(store) as shared:
            token = issue_scrape_token(path, store=shared)
        if out is None:
            typer.echo(token)
            return
        write_secret_file(out, token)
    except TokenFileError as e:
        fail(str(e))
    except ControllerError as e:  # the shared store
        fail(f"{e}; check --store and that the database is up")
    typer.echo(
        f"coadapt: the scrape token is in {out} (GET /metrics only; Prometheus: "
        "authorization: {credentials_file: ...})"
    )


def _refuse_a_users_copy(p: Path) -> None:
    """A file holding a users' token only is a CLI's copy for a deployed cluster."""
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return  # the rotation itself says what is wrong with it
    if isinstance(data, dict) and set(data) == {"user"}:
        fail(
            f"{p} is this CLI's copy of a deployed cluster's users' token; rotate or issue "
            "tokens on the controller machine (coadapt tokens ... --state-dir /var/lib/coadapt), "
            "then "
            f"delete {p} so that the CLI reads the new token"
        )
