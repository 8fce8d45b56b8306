"""AutoLockRenewer of sparkbus.aio: the sync renewer's thread renews the locks through the sync receivers
and sessions under the async ones (a renewal never waits on the event loop); a failure callback, a coroutine
function as the SDK's async one takes, is scheduled on the loop the renewer was registered from."""
from __future__ import annotations

import asyncio
import inspect
from typing import Awaitable, Callable, Optional, Union

from ..autolock import AutoLockRenewer as SyncRenewer
from ..receiver import ServiceBusReceivedMessage
from .receiver import ServiceBusReceiver, ServiceBusSession

Renewable = Union[ServiceBusReceivedMessage, ServiceBusSession]
FailureCallback = Callable[[Renewable, Optional[Exception]], Union[Awaitable[None], None]]


class AutoLockRenewer:
    """Keeps message and session locks alive while long handlers run (azure.servicebus.aio's shape:
    register() is plain, close() and the context manager are async)."""

    def __init__(self, max_lock_renewal_duration: float = 300,
                 on_lock_renew_failure: Optional[FailureCallback] = None, **kwargs: object) -> None:
        self._sync = SyncRenewer(max_lock_renewal_duration)
        self._default_callback = on_lock_renew_failure

    async def __aenter__(self) -> "AutoLockRenewer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def register(self, receiver: ServiceBusReceiver, renewable: Renewable,
                 max_lock_renewal_duration: Optional[float] = None,
                 on_lock_renew_failure: Optional[FailureCallback] = None) -> None:
        """Keep renewable's lock (a received message, or receiver.session) alive through receiver, which
        must have connected (`async with receiver`, or a receive)."""
        if not isinstance(receiver, ServiceBusReceiver):
            raise TypeError(f"receiver must be a sparkbus.aio ServiceBusReceiver, got {type(receiver).__name__}")
        if receiver._sync.value is None:
            raise ValueError("the receiver has not connected yet: register inside `async with receiver`")
        target = renewable._sync if isinstance(renewable, ServiceBusSession) else renewable
        callback = on_lock_renew_failure or self._default_callback
        self._sync.register(receiver._sync.value, target, max_lock_renewal_duration,
                            None if callback is None else _on_loop(callback, renewable, asyncio.get_running_loop()))

    @property
    def renewals(self) -> int:
        """Locks renewed so far (a sparkbus addition: processors count them)."""
        return self._sync.renewals

    async def close(self) -> None:
        """Stop renewing; locks then lapse on their own."""
        await asyncio.to_thread(self._sync.close)


def _on_loop(callback: FailureCallback, renewable: Renewable,
             loop: asyncio.AbstractEventLoop) -> Callable[[object, Optional[Exception]], None]:
    """The sync renewer's failure callback (called on its thread): runs callback(renewable, error) on loop."""
    def failed(_: object, error: Optional[Exception]) -> None:
        if inspect.iscoroutinefunction(callback):
            asyncio.run_coroutine_threadsafe(callback(renewable, error), loop)
        else:
            loop.call_soon_threadsafe(callback, renewable, error)
    return failed
