"""Two real ``coadapt up`` processes, each with its own state folder (two machines), on one
real PostgreSQL store: they check the same credentials, the store's. A users' token of one
is accepted by the other, a rotation made on one machine (``coadapt tokens rotate --store``)
is honoured by the other within a second or two, an agent credential minted by the leader
opens the standby's agent endpoints, and the scrape token still opens ``/metrics`` only."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from coadapt_common.procfs import PROC_ROOT
from providers.local import LocalProvider

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

NEEDS_PROC = pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip


def _status(url: str, path: str, token: str) -> int:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _tokens(state: Path) -> dict[str, object]:
    doc = json.loads((state / "tokens.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _within(seconds: float, check: object) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def pair(
    tmp_path: Path, postgres_url: str
) -> Iterator[tuple[dict[str, str], list[Path], list[str]]]:
    """Two ``coadapt up`` on one store, each with its own state folder and port."""
    env = {**os.environ, "COADAPT_STORE_URL": postgres_url, "PYTHONPATH": str(ROOT)}
    ports = [_free_port(), _free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    states = [tmp_path / "a", tmp_path / "b"]
    procs: list[subprocess.Popen[str]] = []
    logs = [(tmp_path / f"up-{i}.log").open("w") for i in range(2)]
    try:
        for i in range(2):  # one after the other: the first builds the store
            procs.append(subprocess.Popen(
                [*COADAPT, "up", "--state-dir", str(states[i]), "--port", str(ports[i]),
                 "--api-urls", ",".join(urls), "--interval-s", "1", "--max-gpu-slots", "1",
                 "--max-instances", "1", "--job-isolation", "none"],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=logs[i], stderr=subprocess.STDOUT,
                text=True, env=env,
            ))  # fmt: skip
            assert _within(60, lambda i=i: (states[i] / "up.json").exists()), (
                tmp_path / f"up-{i}.log"
            ).read_text()[-3000:]
        yield env, states, urls
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        for state in states:
            LocalProvider(state / "local").down("coadapt-local")


@pytest.mark.slow
@NEEDS_PROC
def test_two_controllers_on_one_store_check_the_same_credentials(
    pair: tuple[dict[str, str], list[Path], list[str]], postgres_url: str
) -> None:
    env, (a, b), (url_a, url_b) = pair
    # One users' token, in the store and in each machine's copy (0600).
    user = _tokens(a)["user"]
    assert isinstance(user, str) and _tokens(b)["user"] == user
    for state in (a, b):
        assert stat.S_IMODE((state / "tokens.json").stat().st_mode) == 0o600
        assert _tokens(state)["shared_store"] is True
    with psycopg.connect(postgres_url) as pg:
        row = pg.execute("SELECT value FROM meta WHERE key = 'api_credentials'").fetchone()
    assert row is not None
    (doc,) = row
    assert json.loads(doc)["user"] == user
    for url in (url_a, url_b):
        assert _status(url, "/v1/jobs", user) == 200
        assert _status(url, "/v1/jobs", "not-the-token-0123456789") == 401

    # A job submitted through B; the leader's agent credential opens the other's agent
    # endpoints (and not a user endpoint).
    submitted = _run(env, "submit", str(ROOT / "examples/jobs/mlp-small.yaml"),
                     "--state-dir", str(b))  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    files: list[Path] = []

    def agent_file() -> bool:
        files[:] = [*a.glob("agents/*/agent-token.json"), *b.glob("agents/*/agent-token.json")]
        return bool(files)

    assert _within(90, agent_file), "no agent was launched"
    minted = files[0]
    key = minted.parent.name
    credential = json.loads(minted.read_text())["agent"]
    other = url_b if minted.is_relative_to(a) else url_a
    assert _status(other, f"/v1/agents/{key}/assignments", credential) == 200
    assert _status(other, "/v1/jobs", credential) == 403

    # A rotation of the users' token on machine A is honoured by B: the old one refused,
    # the new one accepted, B's copy rewritten.
    rotated = _run(env, "tokens", "rotate", "user", "--state-dir", str(a))
    assert rotated.returncode == 0, rotated.stderr
    new = _tokens(a)["user"]
    assert isinstance(new, str) and new != user
    assert _within(5, lambda: _status(url_b, "/v1/jobs", user) == 401)
    assert _status(url_b, "/v1/jobs", new) == 200
    assert _within(5, lambda: _tokens(b)["user"] == new)
    # A re-reads the store's row within its TTL too (a read that failed keeps the old
    # credentials one TTL more: under load this took longer than one immediate check).
    assert _within(5, lambda: _status(url_a, "/v1/jobs", user) == 401)

    # The scrape token issued on B opens A's /metrics, and nothing else.
    scrape = _run(env, "tokens", "scrape", "--state-dir", str(b))
    assert scrape.returncode == 0, scrape.stderr
    token = scrape.stdout.strip()
    assert _within(5, lambda: _status(url_a, "/metrics", token) == 200)
    assert _status(url_a, "/v1/jobs", token) == 403
    again = _run(env, "tokens", "scrape", "--state-dir", str(a))
    assert again.stdout.strip() == token  # issuing it again gives the same token

    # The agent key rotated on B: the old credential stays honoured by A for the grace
    # period (the store's previous key), a credential of the new key is accepted too.
    rotated = _run(env, "tokens", "rotate", "agent-key", "--state-dir", str(b))
    assert rotated.returncode == 0, rotated.stderr
    time.sleep(1.5)
    assert _status(url_a, f"/v1/agents/{key}/assignments", credential) == 200

    # Without the store, the copy is not rotated (it would change nothing the API checks).
    no_store = {k: v for k, v in env.items() if k != "COADAPT_STORE_URL"}
    refused = _run(no_store, "tokens", "rotate", "user", "--state-dir", str(b))
    assert refused.returncode == 1 and "--store" in refused.stderr
    assert _tokens(b)["user"] == new


def test_the_store_holds_one_set_of_credentials_rotated_in_a_transaction(
    store_location: Path | str, tmp_path: Path
) -> None:
    """On both back ends: the first controller's credentials win, a rotation through one
    store object is seen by another's source once its TTL has passed, a copy is not rotated
    without the store, and a refused agent-key rotation writes nothing."""
    from autoscaler.controller.credentials import (
        StoreCredentials,
        TokenFileError,
        rotate_agent_key,
        rotate_user_token,
    )
    from autoscaler.controller.store import Store
    from coadapt_common.clock import FakeClock

    clock = FakeClock(start_s=1_700_000_000.0)
    s1 = Store.create(store_location, "creds", clock)
    s2 = Store.open(store_location, clock)
    try:
        one = StoreCredentials.open(s1, tmp_path / "one.json")
        two = StoreCredentials.open(s2, tmp_path / "two.json", ttl_s=0.0)
        assert one.current().user == two.current().user
        assert one.current().agent_key == two.current().agent_key
        new = rotate_user_token(tmp_path / "one.json", store=s1)
        assert two.current().user == new.user  # read again: the TTL is 0
        assert json.loads((tmp_path / "two.json").read_text())["user"] == new.user
        with pytest.raises(TokenFileError, match="--store"):
            rotate_user_token(tmp_path / "two.json")
        rotate_agent_key(tmp_path / "two.json", now_s=clock.now_s(), store=s2)
        held = s1.api_credentials_doc()
        with pytest.raises(TokenFileError, match="grace period"):
            rotate_agent_key(tmp_path / "one.json", now_s=clock.now_s(), store=s1)
        assert s1.api_credentials_doc() == held  # nothing written
    finally:
        s1.close()
        s2.close()
