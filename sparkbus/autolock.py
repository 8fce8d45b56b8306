"""AutoLockRenewer (azure-servicebus shape): keeps message locks alive while long handlers run."""
from __future__ import annotations

import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, Optional, Union

from .receiver import ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSession
from .engine import clock, metrics

Renewable = Union[ServiceBusReceivedMessage, ServiceBusSession]
FailureCallback = Callable[[Renewable, Optional[Exception]], None]
RENEW_BEFORE_SECONDS = 10.0  # renew this long before a lock lapses (or half way through shorter locks)
TICK_SECONDS = 0.2


@dataclass
class _Registration:
    receiver: ServiceBusReceiver
    renewable: Renewable
    deadline: float
    renew_within: float  # seconds before the lock lapses at which it is renewed
    on_failure: Optional[FailureCallback]


class AutoLockRenewer:
    """Renews the locks of registered messages from a background thread until they are settled, their
    max_lock_renewal_duration passes, or a renewal fails (then on_lock_renew_failure is called).

    Args:
        max_lock_renewal_duration: Seconds a registered lock is kept alive, unless register is given another.
        on_lock_renew_failure: Called with the message (or session) and the error when a renewal fails, unless
            register is given another; default: none.
        executor: azure-servicebus', accepted for ported code: one thread renews every lock here (a renewal is
            one small commit), so no pool is needed.
        max_workers: As executor.

    Raises:
        TypeError: executor is not a concurrent.futures.Executor.
        ValueError: max_workers is not an int >= 1 or None, or max_lock_renewal_duration is not positive.
    """

    def __init__(self, max_lock_renewal_duration: float = 300, on_lock_renew_failure: Optional[FailureCallback] = None,
                 executor: Optional[Executor] = None, max_workers: Optional[int] = None) -> None:
        if executor is not None and not isinstance(executor, Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}")
        if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                        or max_workers < 1):
            raise ValueError(f"max_workers must be an int >= 1 or None, got {max_workers!r}")
        self._default_duration = _check_duration(max_lock_renewal_duration)
        self._default_callback = on_lock_renew_failure
        self._registered: list[_Registration] = []
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.renewals = 0  # locks renewed so far (a sparkbus addition: processors count them)

    def __enter__(self) -> "AutoLockRenewer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, receiver: ServiceBusReceiver, renewable: Renewable,
                 max_lock_renewal_duration: Optional[float] = None,
                 on_lock_renew_failure: Optional[FailureCallback] = None) -> None:
        """Keep renewable's lock alive through receiver.

        Args:
            receiver: The receiver that received the message, or holds the session.
            renewable: A message received in PEEK_LOCK mode, or a receiver's session.
            max_lock_renewal_duration: Seconds to keep it alive; default: the renewer's.
            on_lock_renew_failure: Called with it and the error when a renewal fails; default: the renewer's.

        Raises:
            TypeError: receiver is not a ServiceBusReceiver.
            ValueError: renewable carries no lock to renew, the renewer is closed, or the duration is not
                positive.
        """
        if not hasattr(receiver, "renew_message_lock"):
            raise TypeError(f"receiver must be a ServiceBusReceiver, got {type(receiver).__name__}")
        if not _is_session(renewable) and getattr(renewable, "lock_token", None) is None:
            raise ValueError("only messages received in PEEK_LOCK mode carry a lock to renew")
        if self._stop.is_set():
            raise ValueError("the AutoLockRenewer is closed")
        duration = self._default_duration if max_lock_renewal_duration is None else _check_duration(max_lock_renewal_duration)
        locked_until = renewable.locked_until_utc
        if locked_until is None:  # a message from_bytes made of a payload with a lock token but no x-opt-locked-until
            raise ValueError("the message carries no locked_until_utc: its lock cannot be renewed")
        remaining = (locked_until - clock.now()).total_seconds()
        renew_within = min(RENEW_BEFORE_SECONDS, max(remaining, 0) / 2)
        with self._guard:
            self._registered.append(_Registration(receiver, renewable, clock.monotonic() + duration, renew_within,
                                                  on_lock_renew_failure or self._default_callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sparkbus-lock-renewer", daemon=True)
                self._thread.start()

    def close(self, wait: bool = True) -> None:
        """Stop renewing; locks then lapse on their own.

        Args:
            wait: Whether to return only once the renewing thread has ended.
        """
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            with self._guard:
                current = list(self._registered)
            for item in current:
                if not self._keep(item):
                    with self._guard:
                        self._registered.remove(item)

    def _keep(self, item: _Registration) -> bool:
        """Renew item if due; False once it needs no more attention."""
        message = item.renewable
        if getattr(message, "_settled", False) or clock.monotonic() >= item.deadline:
            return False
        locked_until = message.locked_until_utc
        assert locked_until is not None  # register refuses a message without one
        remaining = (locked_until - clock.now()).total_seconds()
        if remaining > item.renew_within:
            return True
        try:
            if isinstance(message, ServiceBusSession):
                message.renew_lock()
            else:
                item.receiver.renew_message_lock(message)
            self.renewals += 1
            item.receiver._record(metrics.RENEWED)
            return True
        except Exception as error:  # reported, never up the renewing thread (ValueError: receiver closed)
            if item.on_failure is not None:
                item.on_failure(message, error)
            return False


def _is_session(renewable: object) -> bool:
    return isinstance(renewable, ServiceBusSession)


def _check_duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"max_lock_renewal_duration must be a positive number of seconds, got {value!r}")
    return float(value)
