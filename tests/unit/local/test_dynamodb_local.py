"""Installing DynamoDB Local: hash pinning and error messages, without network or Java."""

from __future__ import annotations

import hashlib
import io
import socket
import tarfile
from pathlib import Path

import pytest

from tally.local import dynamodb_local
from tally.local.dynamodb_local import (
    UPSTREAM_SHA256,
    DynamoDBLocal,
    DynamoDBLocalUnavailable,
    ensure_installed,
    install_dir,
    install_from_tarball,
    local_client_kwargs,
)
from tests.harness.endpoints import endpoint_from_env

FAKE_JAR = b"not really a jar"


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLY_CACHE_DIR", str(tmp_path / "cache"))


def _fake_package(tmp_path: Path, upstream_sha: str = UPSTREAM_SHA256) -> Path:
    """Write an npm-pack-style tarball holding a fake emulator folder."""
    tarball = tmp_path / "amplify-dynamodb-simulator-0.0.0.tgz"
    files = {
        "package/package.json": b"{}",
        "package/emulator/DynamoDBLocal.jar": FAKE_JAR,
        "package/emulator/sha256": upstream_sha.encode(),
        "package/emulator/DynamoDBLocal_lib/libsqlite4java.so": b"\0",
    }
    with tarfile.open(tarball, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tarball


def test_wrong_jar_hash_is_rejected_and_not_installed(tmp_path: Path) -> None:
    with pytest.raises(DynamoDBLocalUnavailable, match=r"DynamoDBLocal\.jar has sha256"):
        install_from_tarball(_fake_package(tmp_path))

    assert not install_dir().exists()
    assert list(install_dir().parent.iterdir()) == []


def test_wrong_upstream_hash_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(DynamoDBLocalUnavailable, match=r"records upstream sha256 0+, expected"):
        install_from_tarball(_fake_package(tmp_path, upstream_sha="0" * 64))

    assert not install_dir().exists()


def test_verified_install_is_reused_without_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dynamodb_local, "JAR_SHA256", hashlib.sha256(FAKE_JAR).hexdigest())
    jar = install_from_tarball(_fake_package(tmp_path))

    assert jar == install_dir() / "DynamoDBLocal.jar"
    assert jar.read_bytes() == FAKE_JAR
    assert (install_dir() / "DynamoDBLocal_lib" / "libsqlite4java.so").is_file()
    assert not (install_dir() / "package.json").exists()
    monkeypatch.setenv("PATH", "")
    assert ensure_installed() == jar


def test_missing_npm_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    with pytest.raises(DynamoDBLocalUnavailable, match=r"Node\.js/npm.*DYNAMODB_ENDPOINT"):
        ensure_installed()


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    with pytest.raises(DynamoDBLocalUnavailable, match=r"Java 17 runtime.*DYNAMODB_ENDPOINT"):
        DynamoDBLocal().start()


def test_busy_port_is_refused_before_starting() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        with pytest.raises(DynamoDBLocalUnavailable, match=f"port {port} is already in use"):
            DynamoDBLocal(port=port).start()


def test_endpoint_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    assert endpoint_from_env() is None

    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://boto:8000")
    assert endpoint_from_env() == "http://boto:8000"

    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://tally:8000")
    assert endpoint_from_env() == "http://tally:8000"


def test_local_client_kwargs_keeps_real_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    assert local_client_kwargs("http://x") == {
        "endpoint_url": "http://x",
        "region_name": "eu-west-1",
    }

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    kwargs = local_client_kwargs("http://x")
    assert kwargs["region_name"] == "us-east-1"
    assert kwargs["aws_access_key_id"] and kwargs["aws_secret_access_key"]
