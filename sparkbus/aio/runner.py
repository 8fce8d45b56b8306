"""How the async API runs the engine: every storage operation is the sync API's own call, run on a bounded
thread pool that one async client and everything it made share, so the event loop never blocks on storage.

Concurrency: coroutines that send at once run their sends on the pool's threads at once, where the sync
sender's group commit joins them into shared commits, as it does for threads. The pool is bounded
(WORKERS): a thousand coroutines do not start a thousand threads; the ones beyond wait their turn on the
loop, costing nothing.

Retries: a throttled request did nothing, so its call does not sleep on its thread: it hands the pause back
(sparkbus.engine.retry.Backoff), the coroutine awaits it on the loop and calls again, the retry count and
timeout carried on. A thousand throttled coroutines hold no thread, and calls that are not throttled
(settlement, peeks of a free namespace) go on meanwhile.

Cancellation: a thread cannot be interrupted, so a cancelled coroutine stops waiting for its call at once
while the call runs to its end; `call(..., undo=)` hands what such an abandoned call returned to undo (on
the pool), which is how a cancelled receive gives back the messages it locked but never handed out.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, Optional, Protocol, TypeVar

from ..engine import retry

LOG = logging.getLogger("sparkbus.aio")
T = TypeVar("T")
WORKERS = 8  # threads per client: storage calls at once (the group commit's widest batch of concurrent sends)


class Runner:
    """A client's thread pool, started at the first call; closing it waits for the calls under way, and a
    call after that starts a new pool (an SDK client may be used again after `async with` closed it)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = workers
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def _started(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="sparkbus-aio")
            return self._pool

    async def call(self, function: Callable[..., T], *args: object, undo: Optional[Callable[[T], None]] = None,
                   **kwargs: object) -> T:
        """function(*args, **kwargs) on the pool, awaited, its retry pauses awaited on the loop (module
        docstring). When the awaiting task is cancelled before the call ends, the call still ends, and undo
        (if given) receives its result; its exceptions stay there."""
        resume: Optional[retry.Resume] = None
        while True:
            try:
                return await self._once(functools.partial(retry.handing_over, resume, function, *args, **kwargs),
                                        undo)
            except retry.Backoff as backoff:
                await asyncio.sleep(backoff.seconds)
                resume = backoff.resume

    async def _once(self, call: Callable[[], T], undo: Optional[Callable[[T], None]]) -> T:
        future = self._started().submit(call)
        if undo is None:
            return await asyncio.wrap_future(future)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            # on the pool's thread as soon as the call ends, whatever the loop does meanwhile (a loop blocked
            # or closed must not keep what the call took); here at once if it had just ended
            future.add_done_callback(functools.partial(_undo, undo))
            raise

    async def close(self) -> None:
        """Wait for the calls under way (and their undos) to end; the next call starts a new pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True)


def _undo(undo: Callable[[T], None], done: "Future[T]") -> None:
    """Hand what an abandoned call returned to undo (nothing when it failed); a failure there is logged,
    never raised (nobody awaits it)."""
    if done.cancelled() or done.exception() is not None:
        return
    try:
        undo(done.result())
    except Exception:  # the lock it could not give back lapses on its own
        LOG.warning("could not give back what a cancelled call took", exc_info=True)


class Lazy(Generic[T]):
    """The sync object behind an async one, made on first use by `make` (once, however many coroutines ask
    at the same time): the SDK's async clients connect lazily, and making a sync one reads storage."""

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make
        self._lock = asyncio.Lock()
        self.value: Optional[T] = None  # None until made

    async def get(self) -> T:
        async with self._lock:
            if self.value is None:
                self.value = await self._make()
            return self.value


class PoolBound(Protocol):
    """What on_pool's and listed_on_pool's methods are bound to: an object with its client's Runner and its
    sync counterpart."""

    @property
    def _runner(self) -> Runner: ...

    def _handler(self) -> Awaitable[object]: ...


def on_pool(sync_method: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """The async form of a sync API method: awaits the method of the same name of the object's sync
    counterpart (`await self._handler()`, usually a Lazy's get) on the client's pool (`self._runner`); name, docstring and
    signature are the sync method's (inspect.signature follows __wrapped__)."""
    name = sync_method.__name__

    @functools.wraps(sync_method)
    async def method(self: PoolBound, *args: object, **kwargs: Any) -> T:
        handler = await self._handler()
        function: Callable[..., T] = getattr(handler, name)  # sync_method, bound to handler
        return await self._runner.call(function, *args, **kwargs)
    return method


class AsyncList(Generic[T]):
    """What a list method returns: iterate it with `async for` (the sync list is read on the pool at the
    first step); by_page() yields it as one page."""

    def __init__(self, read: Callable[[], Awaitable[list[T]]]) -> None:
        self._read = read

    def __aiter__(self) -> AsyncIterator[T]:
        return self._items()

    async def _items(self) -> AsyncIterator[T]:
        for item in await self._read():
            yield item

    def by_page(self, continuation_token: Optional[str] = None) -> AsyncIterator[AsyncIterator[T]]:
        return self._pages()

    async def _pages(self) -> AsyncIterator[AsyncIterator[T]]:
        yield self._items()


def listed_on_pool(sync_method: Callable[..., list[T]]) -> Callable[..., AsyncList[T]]:
    """The async form of a sync list method: a plain method returning an AsyncList, whose first step awaits
    the sync method on the pool (as on_pool)."""
    name = sync_method.__name__

    @functools.wraps(sync_method)
    def method(self: PoolBound, *args: object, **kwargs: Any) -> AsyncList[T]:
        async def read() -> list[T]:
            admin = await self._handler()
            function: Callable[..., list[T]] = getattr(admin, name)  # sync_method, bound to admin
            return await self._runner.call(function, *args, **kwargs)
        return AsyncList(read)
    return method
