"""A TCP proxy on loopback that delays what clients send by a fixed time: a store one region away.

Every chunk a client sends is forwarded `latency_ms` after it arrived (a delay line, so a request of many
chunks is delayed once, not once per chunk, and requests on several connections are delayed side by side);
answers come back at once. A request therefore takes `latency_ms` longer, as over a link with that round
trip, and an operation that waits for N requests one after another takes N x latency_ms longer: comparing
an operation's time at 0 and 20 ms gives N. It also counts the HTTP requests it forwards (a chunk that starts
with a method, on a connection whose previous request was answered).

Run in a process of its own (delta-rs calls can hold the GIL of the process that makes them):
    python benchmarks/latency_proxy.py --target 127.0.0.1:10000 --latency-ms 20 --port-file PORTFILE
or from Python with Proxy(target, latency_ms).start() / .stop().
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import time
from typing import Any, Optional

METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ", b"PATCH ", b"OPTIONS ")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                counter: Optional[list[int]], answered: Optional[asyncio.Event], log: Optional[Any] = None) -> None:
    """Copy reader to writer, each chunk `delay` seconds after it arrived (order kept)."""
    loop = asyncio.get_running_loop()
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await line.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.ensure_future(deliver())
    try:
        while True:
            data = await reader.read(1 << 16)
            if counter is not None and answered is not None and data.startswith(METHODS) and answered.is_set():
                counter[0] += 1
                answered.clear()
                if log is not None:
                    log.write(f"{time.monotonic():.4f} {data.split(b' HTTP/', 1)[0].decode(errors='replace')}\n")
                    log.flush()
            if answered is not None and counter is None and data:
                answered.set()
            await line.put((loop.time() + delay, data))
            if not data:
                break
    except (ConnectionError, OSError):
        await line.put((0.0, b""))
    await sender


async def _serve(target: tuple[str, int], latency_ms: float, ready: "multiprocessing.synchronize.Event | None",
                 port_value: "multiprocessing.sharedctypes.Synchronized[int] | None",
                 count_value: "multiprocessing.sharedctypes.Synchronized[int] | None", port: int = 0,
                 log_path: Optional[str] = None) -> None:
    counter = [0]
    log = open(log_path, "a") if log_path else None

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        answered = asyncio.Event()
        answered.set()
        await asyncio.gather(_pipe(client_reader, server_writer, latency_ms / 1000, counter, answered, log),
                             _pipe(server_reader, client_writer, 0.0, None, answered), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    if port_value is not None:
        port_value.value = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set()
    async with server:
        while True:
            await asyncio.sleep(0.05)
            if count_value is not None:
                count_value.value = counter[0]


def _run(target: tuple[str, int], latency_ms: float, ready: "multiprocessing.synchronize.Event",
         port_value: "multiprocessing.sharedctypes.Synchronized[int]",
         count_value: "multiprocessing.sharedctypes.Synchronized[int]", log_path: Optional[str]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(_serve(target, latency_ms, ready, port_value, count_value, 0, log_path))


class Proxy:
    """The proxy in a spawned process: start() returns its loopback port; requests() how many it forwarded;
    with log_path, each request's arrival time, method and path are appended to that file."""

    def __init__(self, target: str, latency_ms: float, log_path: Optional[str] = None) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host or "127.0.0.1", int(port))
        self.latency_ms = latency_ms
        context = multiprocessing.get_context("spawn")
        self._ready = context.Event()
        self._port = context.Value("i", 0)
        self._count = context.Value("q", 0)
        self._process = context.Process(target=_run, args=(self.target, latency_ms, self._ready, self._port,
                                                            self._count, log_path), daemon=True)

    def start(self) -> int:
        self._process.start()
        if not self._ready.wait(30):
            raise RuntimeError("the latency proxy did not start")
        return int(self._port.value)

    def requests(self) -> int:
        time.sleep(0.06)  # the count is published every 50 ms
        return int(self._count.value)

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the store")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    with socket.socket() as probe:  # fail early on a target that does not listen
        probe.connect((host or "127.0.0.1", int(port)))
    asyncio.run(_serve((host or "127.0.0.1", int(port)), args.latency_ms, None, None, None, args.port))


if __name__ == "__main__":
    main()
