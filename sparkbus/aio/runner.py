"""How the async API runs the engine: every storage operation is the sync API's own call, run on a bounded
thread pool that one async client and everything it made share, so the event loop never blocks on storage.

Concurrency: coroutines that send at once run their sends on the pool's threads at once, where the sync
sender's group commit joins them into shared commits, as it does for threads. The pool is bounded
(WORKERS): a thousand coroutines do not start a thousand threads; the ones beyond wait their turn on the
loop, costing nothing.

Cancellation: a thread cannot be interrupted, so a cancelled coroutine stops waiting for its call at once
while the call runs to its end; `call(..., undo=)` hands what such an abandoned call returned to undo (on
the pool), which is how a cancelled receive gives back the messages it locked but never handed out.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable, Optional, TypeVar

LOG = logging.getLogger("sparkbus.aio")
T = TypeVar("T")
WORKERS = 8  # threads per client: storage calls at once (the group commit's widest batch of concurrent sends)


class Runner:
    """A client's thread pool; closing it waits for calls under way."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sparkbus-aio")
        self._lock = threading.Lock()
        self._closed = False

    async def call(self, function: Callable[..., T], *args: object, undo: Optional[Callable[[T], None]] = None,
                   **kwargs: object) -> T:
        """function(*args, **kwargs) on the pool, awaited. When the awaiting task is cancelled before the
        call ends, the call still ends, and undo (if given) receives its result; its exceptions stay there."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(function, *args, **kwargs))
        if undo is None:
            return await future
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda done: self._undo(done, undo))
            raise

    def _undo(self, done: "asyncio.Future[T]", undo: Callable[[T], None]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        with self._lock:
            if not self._closed:
                self._pool.submit(_quietly, undo, done.result())
                return
        _quietly(undo, done.result())  # the client closed meanwhile: undo here (the loop's thread), once

    async def close(self) -> None:
        """Stop taking calls and wait for the calls under way (and their undos) to end."""
        with self._lock:
            self._closed = True
        await asyncio.to_thread(self._pool.shutdown, wait=True)


def _quietly(undo: Callable[[T], None], result: T) -> None:
    """Run undo; a failure there is logged, never raised (nobody awaits it)."""
    try:
        undo(result)
    except Exception:  # the lock it could not give back lapses on its own
        LOG.warning("could not give back what a cancelled call took", exc_info=True)


def on_pool(sync_method: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """The async form of a sync API method: awaits the method of the same name of the object's sync
    counterpart (`await self._handler()`) on the client's pool (`self._runner`); name, docstring and
    signature are the sync method's (inspect.signature follows __wrapped__)."""
    name = sync_method.__name__

    @functools.wraps(sync_method)
    async def method(self, *args: object, **kwargs: object) -> T:
        handler = await self._handler()
        return await self._runner.call(getattr(handler, name), *args, **kwargs)
    return method
