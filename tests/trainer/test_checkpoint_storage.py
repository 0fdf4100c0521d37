"""Checkpoint format, fallback on corruption, and the storage backends (local, S3, GCS).

S3 runs against a real moto server (``ThreadedMotoServer(port=0)``); GCS against a small
local HTTP server that implements the four GCS JSON API calls the backend uses (upload media,
download media, list with prefix and pages, delete), since no GCS emulator is installed.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import (
    CheckpointManager,
    checkpoint_name,
    decode,
    encode,
    step_of,
    verify,
)
from trainer.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    TrainerConfigError,
)
from trainer.storage import GcsStore, LocalStore, S3Store, open_store


def _payload(step: int) -> dict:
    return {"step": step, "weights": torch.arange(10, dtype=torch.float32) * step, "note": "x"}


def test_encode_decode_round_trip() -> None:
    blob, info = encode(_payload(7), 7)
    payload, again = decode(blob, info.name)
    assert again == info and info.name == checkpoint_name(7) == "ckpt-000000000007.ckpt"
    assert torch.equal(payload["weights"], _payload(7)["weights"]) and payload["note"] == "x"
    assert step_of(info.name) == 7 and step_of("ckpt-7.ckpt") is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-10], "payload bytes"),
        (
            lambda b: b[: len(b) // 2] + bytes([b[len(b) // 2] ^ 1]) + b[len(b) // 2 + 1 :],
            "checksum",
        ),
        (lambda b: b"NOT-A-CHECKPOINT" + b, "bad magic"),
        (lambda b: b[:20], "header"),
    ],
)
def test_damaged_checkpoints_are_detected(damage, message: str) -> None:
    blob, _ = encode(_payload(1), 1)
    with pytest.raises(CheckpointCorruptError, match=message):
        verify(damage(blob))


def _save(manager: CheckpointManager, step: int) -> None:
    blob, info = encode(_payload(step), step)
    manager.write(blob, info)


def test_manager_keeps_the_last_k_and_ignores_other_objects(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manager = CheckpointManager(store, keep_last=2)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    for step in (5, 10, 15):
        _save(manager, step)
    assert [s for s, _ in manager.checkpoints()] == [15, 10]
    assert "notes.txt" in store.names()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    payload, info = manager.load_latest()
    assert info.checkpoint.step == 15 and payload["step"] == 15 and info.skipped == ()


def test_corrupt_latest_falls_back_to_the_previous_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(LocalStore(tmp_path), keep_last=3)
    for step in (1, 2, 3):
        _save(manager, step)
    latest = tmp_path / checkpoint_name(3)
    latest.write_bytes(latest.read_bytes()[:-1])
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        payload, info = manager.load_latest()
    assert payload["step"] == 2 and info.checkpoint.step == 2
    assert [name for name, _ in info.skipped] == [checkpoint_name(3)]
    assert f"resuming from checkpoint {checkpoint_name(2)}" in caplog.text
    assert f"{checkpoint_name(3)} is unusable" in caplog.text


def test_all_corrupt_refuses_to_start_over(tmp_path: Path) -> None:
    manager = CheckpointManager(LocalStore(tmp_path))
    _save(manager, 1)
    (tmp_path / checkpoint_name(1)).write_bytes(b"garbage")
    with pytest.raises(CheckpointCorruptError, match="no usable checkpoint"):
        manager.load_latest()
    assert CheckpointManager(LocalStore(tmp_path / "empty")).load_latest() is None


def _exercise_store(store) -> None:
    assert store.names() == []
    store.write("a.bin", b"one")
    store.write("a.bin", b"two")  # overwrite is atomic
    store.write("b.bin", b"\x00" * 1000)
    assert sorted(store.names()) == ["a.bin", "b.bin"]
    assert store.read("a.bin") == b"two"
    store.delete("a.bin")
    store.delete("a.bin")  # idempotent
    assert store.names() == ["b.bin"]
    with pytest.raises(CheckpointNotFoundError):
        store.read("a.bin")
    with pytest.raises(TrainerConfigError):
        store.write("../escape", b"x")
    manager = CheckpointManager(store, keep_last=2)
    for step in (1, 2, 3):
        _save(manager, step)
    store.write(checkpoint_name(3), b"torn write")
    payload, info = manager.load_latest()
    assert payload["step"] == 2 and info.skipped[0][0] == checkpoint_name(3)


def test_local_store(tmp_path: Path) -> None:
    _exercise_store(LocalStore(tmp_path / "ckpt"))


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _s3_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_s3_store_against_moto(moto_endpoint: str) -> None:
    client = _s3_client(moto_endpoint)
    client.create_bucket(Bucket="ckpts")
    _exercise_store(S3Store("ckpts", "jobs/j1", client=client))
    # another prefix in the same bucket is a different store
    assert S3Store("ckpts", "jobs/j2", client=client).names() == []


def test_s3_store_errors_are_typed(moto_endpoint: str) -> None:
    store = S3Store("no-such-bucket", "x", client=_s3_client(moto_endpoint))
    with pytest.raises(CheckpointStorageError):
        store.write("a.bin", b"1")


class _FakeGcs(http.server.ThreadingHTTPServer):
    """The subset of the GCS JSON API the backend uses, in memory, with a bearer token."""

    def __init__(self, token: str, page_size: int = 2) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.token = token
        self.page_size = page_size
        super().__init__(("127.0.0.1", 0), _GcsHandler)


class _GcsHandler(http.server.BaseHTTPRequestHandler):
    server: _FakeGcs

    def _reply(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._reply(401, b'{"error": {"code": 401}}')
            return False
        return True

    def _route(self) -> tuple[list[str], dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        return url.path.split("/"), urllib.parse.parse_qs(url.query)

    def do_POST(self) -> None:
        if not self._authorised():
            return
        parts, query = self._route()  # /upload/storage/v1/b/{bucket}/o?uploadType=media&name=
        assert parts[1:4] == ["upload", "storage", "v1"] and query["uploadType"] == ["media"]
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.objects[(parts[5], query["name"][0])] = data
        self._reply(200, json.dumps({"name": query["name"][0]}).encode())

    def do_GET(self) -> None:
        if not self._authorised():
            return
        parts, query = self._route()  # /storage/v1/b/{bucket}/o[/{name}]
        bucket = parts[4]
        if len(parts) == 6:  # list
            prefix = query.get("prefix", [""])[0]
            names = sorted(
                n for b, n in self.server.objects if b == bucket and n.startswith(prefix)
            )
            start = int(query.get("pageToken", ["0"])[0])
            page = names[start : start + self.server.page_size]
            body: dict = {"items": [{"name": n} for n in page]}
            if start + self.server.page_size < len(names):
                body["nextPageToken"] = str(start + self.server.page_size)
            self._reply(200, json.dumps(body).encode())
            return
        name = urllib.parse.unquote(parts[6])
        data = self.server.objects.get((bucket, name))
        if data is None or query.get("alt") != ["media"]:
            self._reply(404, b'{"error": {"code": 404}}')
        else:
            self._reply(200, data, "application/octet-stream")

    def do_DELETE(self) -> None:
        if not self._authorised():
            return
        parts, _ = self._route()
        key = (parts[4], urllib.parse.unquote(parts[6]))
        if self.server.objects.pop(key, None) is None:
            self._reply(404, b'{"error": {"code": 404}}')
        else:
            self._reply(204)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_gcs() -> Iterator[_FakeGcs]:
    server = _FakeGcs(token="test-token")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_gcs_store_against_the_json_api(fake_gcs: _FakeGcs) -> None:
    endpoint = f"http://127.0.0.1:{fake_gcs.server_address[1]}"
    store = GcsStore("bkt", "jobs/j1", endpoint=endpoint, token="test-token")
    _exercise_store(store)
    for i in range(5):  # more objects than one list page
        store.write(f"extra-{i}", b"x")
    assert len(store.names()) == 3 + 5  # b.bin, two checkpoints, five extras
    assert all(bucket == "bkt" and name.startswith("jobs/j1/") for bucket, name in fake_gcs.objects)
    with pytest.raises(CheckpointStorageError, match="401"):
        GcsStore("bkt", "p", endpoint=endpoint, token="wrong").names()


def test_open_store_dispatches_on_the_uri(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_store("gs://bucket/prefix"), GcsStore)
    with pytest.raises(TrainerConfigError):
        open_store("ftp://host/x")
