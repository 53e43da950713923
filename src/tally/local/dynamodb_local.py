"""Fetch, verify and run DynamoDB Local (AWS's Java emulator) without Docker."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO, Self, TypedDict

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError

VERSION = "1.25.1"
NPM_PACKAGE = "amplify-dynamodb-simulator@2.9.30"
# sha256 of AWS's dynamodb_local tarball, as recorded in the npm package's emulator/sha256.
UPSTREAM_SHA256 = "55b425a9a42cfc728436eaf0e4ae64d688b64d177c99c4f4c4d7e3dbb3ac6c09"
JAR_SHA256 = "454305e9bc3e6ebcca5b62569869e31563b8d7e346474e94557b2600702146c7"
JAR_NAME = "DynamoDBLocal.jar"

_ALTERNATIVE = (
    "or set DYNAMODB_ENDPOINT to a running DynamoDB Local "
    "(e.g. `docker run -p 8000:8000 amazon/dynamodb-local`)"
)


class DynamoDBLocalUnavailable(RuntimeError):
    """DynamoDB Local cannot be installed or started."""


class LocalClientKwargs(TypedDict, total=False):
    """Keyword arguments for boto3.client/resource against a local endpoint."""

    endpoint_url: str
    region_name: str
    aws_access_key_id: str
    aws_secret_access_key: str


def local_client_kwargs(endpoint: str) -> LocalClientKwargs:
    """Return boto3 client kwargs for a local endpoint, with dummy credentials if none are set."""
    # A TypedDict rather than dict[str, str] so `**kwargs` type-checks against boto3's stubs.
    kwargs: LocalClientKwargs = {
        "endpoint_url": endpoint,
        "region_name": os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    }
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        kwargs["aws_access_key_id"] = "local"
        kwargs["aws_secret_access_key"] = "local"
    return kwargs


def cache_dir() -> Path:
    """Return the cache directory, outside the repo so clean clones reuse it."""
    configured = os.environ.get("TALLY_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "tally-reconciler"


def install_dir() -> Path:
    """Return the directory holding the verified emulator."""
    return cache_dir() / f"dynamodb-local-{VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_emulator(emulator_dir: Path) -> Path:
    """Check the emulator folder against the pinned hashes and return its jar path."""
    sha_file = emulator_dir / "sha256"
    jar = emulator_dir / JAR_NAME
    if not sha_file.is_file() or not jar.is_file():
        raise DynamoDBLocalUnavailable(f"{emulator_dir} lacks {JAR_NAME} or its sha256 file")
    recorded = sha_file.read_text().strip()
    if recorded != UPSTREAM_SHA256:
        raise DynamoDBLocalUnavailable(
            f"{NPM_PACKAGE} records upstream sha256 {recorded}, expected {UPSTREAM_SHA256}"
        )
    actual = _sha256(jar)
    if actual != JAR_SHA256:
        raise DynamoDBLocalUnavailable(f"{jar} has sha256 {actual}, expected {JAR_SHA256}")
    return jar


def _is_installed() -> bool:
    try:
        verify_emulator(install_dir())
    except DynamoDBLocalUnavailable:
        return False
    return True


def _extract_emulator(tarball: Path, dest: Path) -> None:
    """Extract only package/emulator/ into dest, refusing links and paths that escape it."""
    prefix = PurePosixPath("package/emulator")
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if not path.is_relative_to(prefix) or path == prefix:
                continue
            rel = path.relative_to(prefix)
            if ".." in rel.parts:
                raise DynamoDBLocalUnavailable(f"unsafe path in {tarball}: {member.name}")
            target = dest.joinpath(*rel.parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                source = tar.extractfile(member)
                if source is None:
                    raise DynamoDBLocalUnavailable(f"cannot read {member.name} in {tarball}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)


def install_from_tarball(tarball: Path) -> Path:
    """Verify and install the emulator from an npm tarball; return the jar path."""
    target = install_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".install-") as work:
        staging = Path(work) / "emulator"
        _extract_emulator(tarball, staging)
        verify_emulator(staging)
        if target.exists():
            # Only reached when the existing install failed verification.
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:
            # A concurrent installer won the rename; accept its result if it verifies.
            if not _is_installed():
                raise
    return target / JAR_NAME


def ensure_installed() -> Path:
    """Install DynamoDB Local into the cache unless a verified copy is there; return the jar."""
    if _is_installed():
        return install_dir() / JAR_NAME
    npm = shutil.which("npm")
    if npm is None:
        raise DynamoDBLocalUnavailable(
            f"npm not found: install Node.js/npm to fetch DynamoDB Local, {_ALTERNATIVE}"
        )
    install_dir().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=install_dir().parent, prefix=".npm-pack-") as work:
        result = subprocess.run(
            [npm, "pack", "--silent", NPM_PACKAGE],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        tarballs = sorted(Path(work).glob("*.tgz"))
        if result.returncode != 0 or len(tarballs) != 1:
            raise DynamoDBLocalUnavailable(
                f"`npm pack {NPM_PACKAGE}` failed ({result.returncode}): {result.stderr.strip()}"
            )
        return install_from_tarball(tarballs[0])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _check_port_free(port: int) -> None:
    # DynamoDB Local binds every interface, so a clash on any of them would make it exit.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as exc:
            raise DynamoDBLocalUnavailable(f"port {port} is already in use: {exc}") from exc


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def command(port: int) -> tuple[list[str], Path]:
    """DynamoDB Local's command line and working directory (installing it if needed)."""
    java = shutil.which("java")
    if java is None:
        raise DynamoDBLocalUnavailable(
            "java not found: install a Java 17 runtime "
            f"(e.g. `apt-get install openjdk-17-jre-headless`), {_ALTERNATIVE}"
        )
    jar = ensure_installed()
    arguments = [
        java,
        "-Djava.library.path=DynamoDBLocal_lib",
        "-jar",
        JAR_NAME,
        "-inMemory",
        # One database for all credentials/regions, so every local client sees the tables.
        "-sharedDb",
        "-port",
        str(port),
        "-disableTelemetry",
    ]
    return arguments, jar.parent


class DynamoDBLocal:
    """A DynamoDB Local process, in memory, listening on one port.

    DynamoDB Local has no option to bind loopback only; it listens on all interfaces.
    """

    def __init__(self, port: int | None = None, startup_timeout: float = 180.0) -> None:
        self.port = port
        self.startup_timeout = startup_timeout
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """Return the HTTP endpoint, available once started."""
        if self.port is None or self._process is None:
            raise RuntimeError("DynamoDB Local is not running")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Start the process and block until it answers ListTables."""
        if self._process is not None:
            raise RuntimeError("DynamoDB Local is already running")
        if self.port is None:
            self.port = _free_port()
        else:
            _check_port_free(self.port)
        arguments, cwd = command(self.port)
        self.log_path = cache_dir() / f"dynamodb-local-{self.port}.log"
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            arguments,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None and self.log_path is not None
        client = boto3.client(
            "dynamodb",
            config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}),
            **local_client_kwargs(self.endpoint),
        )
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                raise DynamoDBLocalUnavailable(
                    f"DynamoDB Local exited with {self._process.returncode}; "
                    f"log {self.log_path}:\n{tail(self.log_path)}"
                )
            try:
                client.list_tables(Limit=1)
                return
            except BotoCoreError:
                if time.monotonic() > deadline:
                    raise DynamoDBLocalUnavailable(
                        f"DynamoDB Local did not answer within {self.startup_timeout:.0f}s; "
                        f"log {self.log_path}:\n{tail(self.log_path)}"
                    ) from None
                time.sleep(0.2)

    def wait(self) -> int:
        """Block until the process exits and return its exit code."""
        if self._process is None:
            raise RuntimeError("DynamoDB Local is not running")
        return self._process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process, killing it if it outlives the timeout."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def port_number(text: str) -> int:
    """A TCP port from the command line (argparse type): 1 to 65535."""
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port from 1 to 65535, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Command line: `fetch` installs the emulator, `run` serves it in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m tally.local.dynamodb_local")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="download, verify and cache DynamoDB Local")
    run = commands.add_parser("run", help="run DynamoDB Local until Ctrl-C")
    run.add_argument("--port", type=port_number, default=8000)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_installed())
            return 0
        # SIGTERM unwinds like Ctrl-C, so the context manager stops Java too.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with DynamoDBLocal(port=args.port) as ddb:
            print(f"DynamoDB Local {VERSION} at {ddb.endpoint} (Ctrl-C stops)", flush=True)
            return ddb.wait()
    except DynamoDBLocalUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
