"""A TCP proxy on loopback in front of a real store that breaks the connections of chosen requests: what a
network does to a client between a request and its answer.

Requests on a connection come one after another (HTTP/1.1 without pipelining, as object_store's client
sends them), so the proxy reads each request whole (its headers and Content-Length body) and forwards it;
answers are copied back as they come. A request whose head `match` finds (a regular expression over the
request line and headers, case-insensitive) is broken, while faults remain, in one of two ways:

- "answer": forwarded, and its answer swallowed and the client's connection reset: the store did what was
  asked and the client cannot know (a conditional PUT that landed, its answer lost);
- "request": the client's connection reset before anything is forwarded: nothing reached the store.

Runs in a spawned process of its own (store clients may hold the GIL of the process calling them):
FaultProxy(target, match, mode, faults).start() returns its port; broken() how many it broke so far.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import signal
import socket
import struct
from typing import Any

_HEAD_END = b"\r\n\r\n"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a TCP reset (linger 0), as a peer or middlebox that drops it does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One whole request (b"" when the client closed the connection)."""
    try:
        head = await reader.readuntil(_HEAD_END)
    except asyncio.IncompleteReadError:
        return b""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + (await reader.readexactly(length) if length else b"")


async def _serve(target: tuple[str, int], match: str, mode: str, faults: int, port_value: Any,
                 broken_value: Any, ready: Any) -> None:
    remaining = [faults]
    chosen = re.compile(match.encode(), re.IGNORECASE | re.DOTALL)

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*target)
        swallow = asyncio.Event()

        async def answers() -> None:
            while data := await server_reader.read(1 << 16):
                if swallow.is_set():
                    _reset(client_writer)
                    return
                client_writer.write(data)
                await client_writer.drain()
            client_writer.close()

        copier = asyncio.ensure_future(answers())
        try:
            while request := await _request(client_reader):
                if remaining[0] > 0 and chosen.search(request.split(_HEAD_END, 1)[0]):
                    remaining[0] -= 1
                    broken_value.value += 1
                    if mode == "request":
                        _reset(client_writer)
                        break
                    swallow.set()
                server_writer.write(request)
                await server_writer.drain()
                if swallow.is_set():
                    await copier
                    break
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            copier.cancel()
            server_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_value.value = server.sockets[0].getsockname()[1]
    ready.set()
    async with server:
        await server.serve_forever()


def _run(*args: Any) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(_serve(*args))


class FaultProxy:
    """The proxy in a spawned process (see the module docstring)."""

    def __init__(self, target: str, match: str, mode: str, faults: int) -> None:
        if mode not in ("answer", "request"):
            raise ValueError(f"mode is 'answer' or 'request', not {mode!r}")
        host, _, port = target.removeprefix("http://").rpartition(":")
        context = multiprocessing.get_context("spawn")
        self._ready = context.Event()
        self._port = context.Value("i", 0)
        self._broken = context.Value("i", 0)
        self._process = context.Process(target=_run, daemon=True, args=(
            (host, int(port)), match, mode, faults, self._port, self._broken, self._ready))

    def start(self) -> int:
        self._process.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start")
        return int(self._port.value)

    def broken(self) -> int:
        return int(self._broken.value)

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
