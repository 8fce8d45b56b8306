"""PostgreSQL and RabbitMQ instances of their own for benchmarks/bench_peers.py, started and stopped by process id.

Each server listens on 127.0.0.1 only, on a free non-default port, with its data and logs under one directory
of the checkout (.bench-servers/): nothing of the Debian services (their ports, data, cookie or epmd) is used,
so a packaged service that happens to run does not matter. As root, each server runs as its Debian system
user (PostgreSQL refuses root; RabbitMQ's scripts expect their user), its directory owned by that user.

Durability as configured: PostgreSQL with fsync=on and synchronous_commit=on (a commit returns after its WAL
is flushed); RabbitMQ's queues are declared durable and messages persistent by the benchmark, which waits for
publisher confirms (sent once a persistent message is on disk).

Stopping: each server is started in a session of its own (its process group id is its pid), so stop() signals
the server by pid (PostgreSQL: SIGINT, a fast shutdown; RabbitMQ's start script: SIGTERM, which it passes on to
the Erlang node), waits, and then kills whatever is left in that process group. A run that was killed outright
leaves pid files behind; the next start() stops those processes first (only if they still run from this
directory).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PG_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "1GB",
    "max_wal_size": "4GB",
    "listen_addresses": "127.0.0.1",
}
PG_USER = "bench"
RABBIT_RUN_AS = "rabbitmq"
PG_RUN_AS = "postgres"
RABBIT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class ServerError(RuntimeError):
    """A server could not be found, started or reached; the message names it and its log."""


def free_port() -> int:
    """A port that is free on 127.0.0.1 now (the kernel's choice: never a server's default)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin() -> Path:
    """The newest installed PostgreSQL's binaries (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise ServerError("PostgreSQL is not installed (apt-get install -y postgresql)")
    return Path(found[-1]).parent


def _run_as(user: str) -> Optional[str]:
    """The user to run a server as: its system user when we are root, else ourselves (None)."""
    return user if os.geteuid() == 0 else None


def _chown(path: Path, user: Optional[str]) -> None:
    if user is not None:
        shutil.chown(path, user, user)
        for sub, dirs, files in os.walk(path):
            for name in dirs + files:
                shutil.chown(os.path.join(sub, name), user, user)


def _wait_port(port: int, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"server exited with {proc.returncode} while starting; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise ServerError(f"server did not listen on 127.0.0.1:{port} within {seconds:.0f} s; see {log}")


@dataclass
class Server:
    """One started server process: its name, process, pid file and how it is asked to stop."""
    name: str
    proc: subprocess.Popen
    pid_file: Path
    stop_signal: int
    info: dict = field(default_factory=dict)


def _stop_pid(pid: int, sig: int, wait: float) -> None:
    """Signal pid, wait up to `wait` s for it to end, then SIGKILL its process group (pgid == pid)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)  # leftovers: Erlang's port programs, PostgreSQL backends
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Servers:
    """PostgreSQL and/or RabbitMQ under `root`; a context manager that always stops what it started."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.servers: list[Server] = []

    def __enter__(self) -> "Servers":
        self.root.mkdir(parents=True, exist_ok=True)
        self._stop_leftovers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _stop_leftovers(self) -> None:
        """Stop servers a killed earlier run left running from this directory, then clear their data."""
        for pid_file in self.root.glob("*.pid"):
            try:
                pid = int(pid_file.read_text().split()[0])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    ours = str(self.root).encode() in f.read()
            except (ValueError, IndexError, OSError):
                ours = False
            if ours:
                _stop_pid(pid, signal.SIGTERM, 30)
            pid_file.unlink()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], user: Optional[str], stop_signal: int) -> Server:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            env = {**env, "SPARKBUS_BENCH_SERVERS": str(self.root)}  # marks the process as ours (see above)
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, user=user, group=user, cwd=self.root)
        pid_file = self.root / f"{name}.pid"
        pid_file.write_text(f"{proc.pid}\n")
        server = Server(name, proc, pid_file, stop_signal, {"log": str(log)})
        self.servers.append(server)
        return server

    def start_postgres(self) -> dict:
        """initdb a fresh cluster and start it; returns {"dsn", "port", "settings", ...}."""
        bindir = pg_bin()
        data = self.root / "postgres"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(mode=0o700)
        user = _run_as(PG_RUN_AS)
        _chown(data, user)
        init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust",
                               "--encoding=UTF8", "--locale=C"], capture_output=True, text=True, user=user,
                              group=user, cwd=self.root)
        if init.returncode:
            raise ServerError(f"initdb failed: {init.stderr.strip()[-2000:]}")
        port = free_port()
        settings = {**PG_SETTINGS, "port": str(port), "unix_socket_directories": str(data)}
        options = [a for k, v in settings.items() for a in ("-c", f"{k}={v}")]
        argv = [str(bindir / "postgres"), "-D", str(data), *options]
        server = self._spawn("postgres", argv, dict(os.environ), user, signal.SIGINT)
        _wait_port(port, server.proc, self.root / "postgres.log", 60)
        dsn = f"host=127.0.0.1 port={port} user={PG_USER} dbname=postgres"
        import psycopg

        deadline = time.monotonic() + 30
        while True:  # listening comes before accepting connections (startup recovery)
            try:
                with psycopg.connect(dsn) as conn:
                    version = conn.execute("SHOW server_version").fetchone()[0]
                    shown = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in PG_SETTINGS}
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        server.info.update(dsn=dsn, port=port, version=version, settings=shown, data=str(data))
        return server.info

    def start_rabbitmq(self) -> dict:
        """A fresh RabbitMQ node with its own epmd; returns {"port", "nodename", ...}."""
        if not os.path.exists(RABBIT_SERVER):
            raise ServerError("RabbitMQ is not installed (apt-get install -y rabbitmq-server)")
        home = self.root / "rabbitmq"
        shutil.rmtree(home, ignore_errors=True)
        (home / "mnesia").mkdir(parents=True)
        (home / "log").mkdir()
        (home / "enabled_plugins").write_text("[].\n")
        (home / "rabbitmq-env.conf").write_text("# empty: the environment of bench_peers.py decides\n")
        (home / "rabbitmq.conf").write_text("# defaults: guest may connect from loopback only\n")
        user = _run_as(RABBIT_RUN_AS)
        _chown(home, user)
        epmd_port, port, dist_port = free_port(), free_port(), free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),  # the Erlang cookie is created here, not in the user's home
            "LANG": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"sparkbus-bench-{os.getpid()}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_PID_FILE": str(home / "node.pid"),
        }
        # epmd in the foreground (not -daemon) so that its pid is the one we started
        epmd = self._spawn("epmd", ["epmd", "-port", str(epmd_port)], env, user, signal.SIGTERM)
        _wait_port(epmd_port, epmd.proc, self.root / "epmd.log", 20)
        server = self._spawn("rabbitmq", [RABBIT_SERVER], env, user, signal.SIGTERM)
        _wait_port(port, server.proc, home / "log", 120)
        server.info.update(port=port, nodename=env["RABBITMQ_NODENAME"], dist_port=dist_port, epmd_port=epmd_port,
                           data=str(home))
        return server.info

    def stop(self) -> None:
        """Stop every started server by its pid (newest first), remove pid files and data directories."""
        while self.servers:
            server = self.servers.pop()
            _stop_pid(server.proc.pid, server.stop_signal, 60)
            server.proc.wait()
            server.pid_file.unlink(missing_ok=True)
        for data in ("postgres", "rabbitmq"):
            shutil.rmtree(self.root / data, ignore_errors=True)
