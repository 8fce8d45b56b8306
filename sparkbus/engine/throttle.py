"""Admission of operations against the namespace's budget, shared by every client of the namespace on
this machine: credit-based throttling (basic, standard) and the premium resource governor (rules in
sparkbus.core.throttling), with the request metrics counted on the way (sparkbus.engine.metrics).

The ledger is one small file in the namespace directory (LEDGER_FILE) holding the budget (credits per
second, operations in flight) and the bucket (period, balance). Every thread of every process reads and
writes it under an exclusive lock: flock across processes (one open file per process) and a thread lock
within one, since flock does not exclude threads sharing an open file. A charge is lock, 40-byte pread,
pwrite, unlock: a few microseconds, beside a send's milliseconds. Nothing is fsynced: processes of one
machine share the page cache, and a machine crash can only forget spending of a period that is over by
the time anything restarts. The budget lives in the ledger, not in each client, so update_namespace
(messaging units, credits) takes effect at every client's next operation.

Operations in flight (premium) each hold one byte of SLOTS_FILE under an fcntl record lock; the kernel
releases a dead process's locks, so a crashed client never keeps a slot.

A request is admitted while the balance is positive; it is charged after it succeeded, with what it
actually used (the messages a receive returned), and may drive the balance negative. A throttled request
did nothing: it is refused before it reads or writes anything, and charged nothing. Clients retry it
under their retry policy: each retry waits the policy's backoff (exponential, with jitter) or until the
ledger's balance turns positive again, whichever is longer (at most retry_backoff_max), so a retry is not
spent while the debt of a bulk send is still being repaid; after the last retry
ServiceBusServerBusyError carries the service's text. Background work (fan-out, forwarding) waits until
it is admitted instead.

Several machines (namespaces on object storage): file locks only reach the processes of one machine, so
there each machine keeps its own ledger (in storage.location.state_dir) and takes a share of the budget
(BudgetLease). Every RENEW_SECONDS while a process makes requests, a thread of it writes the machine's
lease object under LEASE_DIR in the namespace (it expires LEASE_SECONDS later), counts the machines whose
lease has not expired, reads the namespace's budget from the catalog and sets the ledger to budget /
machines (rounded up). Exact within a machine; across machines the namespace admits its budget give or
take the shares of machines that joined or left within the last lease period (a machine that stops is
counted until its lease expires, so the others run on a smaller share for up to LEASE_SECONDS: never
more than the budget). update_namespace reaches other machines at their next renewal. Lease expiry
compares the writer's clock with the reader's: a skew of seconds between machines shifts when a share
changes, not what a machine may spend.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import socket
import struct
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, TypeVar

from ..storage import location
from ..core import throttling
from ..core.throttling import Bucket, Budget
from ..exceptions import ServiceBusError, ServiceBusServerBusyError
from . import metrics
from .retry import RetryPolicy
from . import clock

T = TypeVar("T")
LEDGER_FILE = ".throttle-ledger"
SLOTS_FILE = ".throttle-slots"
_RECORD = struct.Struct("<8sqqqq")  # magic, credits per second, concurrency (-1: unlimited), period, balance
_MAGIC = b"sbledg01"
_UNLIMITED = -1
LEASE_DIR = "_machines"   # object-store namespaces: one lease object per machine using the namespace
LEASE_SECONDS = 30.0      # a lease not renewed for this long no longer holds a share of the budget
RENEW_SECONDS = 10.0
FORGET_SECONDS = 3600.0   # an expired lease older than this is deleted
MACHINE_FILE = "machine-id"
LOG = logging.getLogger("sparkbus.throttle")


@dataclass(frozen=True)
class Usage:
    """What an admitted operation used: credits charged and messages in or out (for the metrics)."""

    credits: int
    incoming_messages: int = 0
    outgoing_messages: int = 0


FREE = Usage(0)


def _period() -> int:
    return int(clock.time())


def _until_next_period() -> float:
    now = clock.time()
    return int(now) + 1 - now


class Ledger:
    """The namespace's budget and credit bucket, in a file every process of this machine shares."""

    def __init__(self, root: str, initial: Callable[[], Budget]) -> None:
        self._fd = os.open(os.path.join(location.state_dir(root), LEDGER_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        with self._locked():
            if self._read() is None:  # a namespace created before the ledger existed
                self._write(initial(), None)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> Optional[tuple[Budget, Bucket]]:
        data = os.pread(self._fd, _RECORD.size, 0)
        if len(data) < _RECORD.size:
            return None
        magic, credits, concurrency, period, balance = _RECORD.unpack(data)
        if magic != _MAGIC:
            return None
        budget = Budget(None if credits == _UNLIMITED else credits, None if concurrency == _UNLIMITED else concurrency)
        return budget, Bucket(period, balance)

    def _record(self) -> tuple[Budget, Bucket]:
        """_read() of a ledger this object opened: it wrote the record then if there was none."""
        record = self._read()
        assert record is not None
        return record

    def _write(self, budget: Budget, bucket: Optional[Bucket]) -> None:
        if bucket is None:  # a full bucket
            bucket = Bucket(_period(), budget.credits_per_second or 0)
        os.pwrite(self._fd, _RECORD.pack(_MAGIC, _UNLIMITED if budget.credits_per_second is None else budget.credits_per_second,
                                         _UNLIMITED if budget.concurrency is None else budget.concurrency,
                                         bucket.period, bucket.balance), 0)

    def close(self) -> None:
        os.close(self._fd)

    def budget(self) -> Budget:
        with self._locked():
            return self._record()[0]

    def admits(self) -> tuple[bool, Budget]:
        """Whether the balance is positive now, and the budget it was judged by."""
        with self._locked():
            budget, bucket = self._record()
            if budget.credits_per_second is None:
                return True, budget
            return throttling.admits(throttling.replenished(bucket, _period(), budget.credits_per_second)), budget

    def seconds_until_admitted(self) -> float:
        """How long until the balance is positive again (0 when it is, or without a credit budget)."""
        with self._locked():
            budget, bucket = self._record()
            if budget.credits_per_second is None:
                return 0.0
            now = clock.time()
            bucket = throttling.replenished(bucket, int(now), budget.credits_per_second)
            periods = throttling.periods_until_admitted(bucket, budget.credits_per_second)
            return 0.0 if periods == 0 else int(now) + periods - now

    def charge(self, credits: int) -> None:
        with self._locked():
            budget, bucket = self._record()
            if budget.credits_per_second is None:
                return
            bucket = throttling.replenished(bucket, _period(), budget.credits_per_second)
            self._write(budget, throttling.charged(bucket, credits))

    def set_budget(self, budget: Budget) -> None:
        """A new budget from now on; what the balance owes is kept, what it holds is capped at a full bucket
        of the new budget."""
        with self._locked():
            old, bucket = self._record()
            if budget.credits_per_second is None or old.credits_per_second is None:
                self._write(budget, None)
                return
            bucket = throttling.replenished(bucket, _period(), old.credits_per_second)
            self._write(budget, Bucket(bucket.period, min(bucket.balance, budget.credits_per_second)))


class Slots:
    """Operations in flight, across the processes of this machine: one locked byte of a file each."""

    def __init__(self, root: str) -> None:
        self._fd = os.open(os.path.join(location.state_dir(root), SLOTS_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        self._held: set[int] = set()  # record locks belong to the process: its threads must not share one
        self._lock = threading.Lock()

    def take(self, limit: int) -> Optional[int]:
        """A free slot below limit (locked until release), or None when all are in use."""
        with self._lock:
            start = random.randrange(limit)
            for i in range(limit):
                slot = (start + i) % limit
                if slot in self._held:
                    continue
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
                except OSError:
                    continue
                self._held.add(slot)
                return slot
            return None

    def release(self, slot: int) -> None:
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
            self._held.discard(slot)


def machine_id(root: str) -> str:
    """This machine's id for the namespace at root: made once, kept in its state directory (every process
    of the machine reads the same one)."""
    path = os.path.join(location.state_dir(root), MACHINE_FILE)
    if not os.path.exists(path):
        draft = f"{path}.{os.getpid()}.{threading.get_ident()}"
        with open(draft, "w", encoding="ascii") as f:
            f.write(f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}")
        try:
            os.link(draft, path)  # the first process to link wins; the others read its id
        except FileExistsError:
            pass
        finally:
            os.remove(draft)
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def live_machines(root: str, now: float) -> int:
    """How many machines hold an unexpired lease on the namespace (leases expired long ago are deleted)."""
    live = 0
    for uri in location.listing(location.join(root, LEASE_DIR)):
        try:
            expires = float(json.loads(location.get(uri))["expires"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            continue  # deleted meanwhile, or not a lease
        if expires > now:
            live += 1
        elif expires < now - FORGET_SECONDS:
            location.remove(uri)
    return live


def renew_share(root: str, budget: Budget, ledger: Ledger) -> Budget:
    """Renew this machine's lease on an object-store namespace and set its ledger to its share of budget;
    returns the share."""
    now = time.time()
    machine = machine_id(root)
    lease = {"machine": machine, "host": socket.gethostname(), "expires": now + LEASE_SECONDS}
    location.put(location.join(root, LEASE_DIR, machine), json.dumps(lease).encode())
    mine = throttling.share(budget, max(1, live_machines(root, now)))
    ledger.set_budget(mine)
    return mine


class BudgetLease:
    """This machine's share of an object-store namespace's budget, renewed as the process's requests go
    by: check() costs a clock read until the lease is due for renewal (every RENEW_SECONDS), then renews it
    on a thread of its own; once the lease has expired (the process was idle), the next request waits for
    the renewal. An idle process writes nothing. budget() reads the namespace's budget from the catalog."""

    def __init__(self, root: str, budget: Callable[[], Budget], ledger: Ledger) -> None:
        self.root, self._budget, self._ledger = root, budget, ledger
        self._lock = threading.Lock()
        self._renewing = False
        self._renew()  # before the first request is admitted

    def _renew(self) -> None:
        started = time.monotonic()
        self.share = renew_share(self.root, self._budget(), self._ledger)
        self._due, self._expires = started + RENEW_SECONDS, started + LEASE_SECONDS

    def check(self) -> None:
        now = time.monotonic()
        if now < self._due:
            return
        with self._lock:
            if now < self._due or self._renewing:
                return
            if now >= self._expires:
                self._renew()
                return
            self._renewing = True
        threading.Thread(target=self._renew_quietly, name="sparkbus-budget-lease", daemon=True).start()

    def _renew_quietly(self) -> None:
        try:
            self._renew()
        except Exception as exc:  # the store is unreachable: keep the last share; the next request retries
            LOG.warning("could not renew the budget lease of %s: %s", self.root, exc)
        finally:
            with self._lock:
                self._renewing = False


class Governor:
    """Admits, charges and counts (into recorder) the operations of one namespace in this process (one per
    namespace: sparkbus.engine.context)."""

    def __init__(self, root: str, initial: Callable[[], Budget], recorder: metrics.Recorder) -> None:
        self.root = root
        self.ledger = Ledger(root, initial)
        self.slots = Slots(root)
        self.lease = None if location.is_local(root) else BudgetLease(root, initial, self.ledger)
        # CPU and memory are metrics of premium namespaces, the ones with a governor's concurrency limit
        recorder.resources = recorder.resources or self.ledger.budget().concurrency is not None
        self.recorder = recorder

    def call(self, entity: str, operation: Callable[[], T], usage: Callable[[T], Usage], policy: RetryPolicy, *,
             wait: bool = False) -> T:
        """Run operation once admitted and charge what usage(result) says. Throttled: retried under
        policy (wait=True: until admitted, for background work), then ServiceBusServerBusyError (50009).
        A throttled request did nothing, so its pauses may be handed over (sparkbus.engine.retry)."""
        policy, retry = (policy, 0) if wait else policy.resumed()
        while True:
            slot, admitted, limited = self._admit()
            if admitted:
                return self._run(entity, operation, usage, slot, charged=limited)
            self.recorder.add(entity, metrics.THROTTLED)
            if not wait and retry >= policy.total:
                raise ServiceBusServerBusyError(throttling.THROTTLED_TEXT)
            retry += 1
            # not before the credits are back (the ledger knows when), nor before the policy's backoff
            owed = max(self.ledger.seconds_until_admitted(), _until_next_period())
            pause = owed if wait else min(max(policy.backoff(retry), owed), max(policy.backoff_max, 0.001))
            pause += random.uniform(0, 0.05)
            if wait:
                policy.pause(pause, "a throttled request")
            else:
                policy.pause_or_hand_over(pause, "a throttled request", retry)

    def count(self, entity: str, operation: Callable[[], T]) -> T:
        """Run an operation that is neither throttled nor charged (settlement), counting it as a request."""
        return self._run(entity, operation, lambda _: FREE, None, charged=False)

    def _run(self, entity: str, operation: Callable[[], T], usage: Callable[[T], Usage], slot: Optional[int], *,
             charged: bool) -> T:
        """operation, counted; charged: what it used is charged to the ledger (the budget it was admitted
        under has a credit rate: without one a charge would only read the ledger again)."""
        try:
            result = operation()
        except (ServiceBusError, ValueError, TypeError, KeyError):
            self.recorder.add(entity, metrics.USER_ERROR)
            raise
        except BaseException:
            self.recorder.add(entity, metrics.SERVER_ERROR)
            raise
        finally:
            if slot is not None:
                self.slots.release(slot)
        used = usage(result)
        if charged and used.credits:
            self.ledger.charge(used.credits)
        self.recorder.add(entity, metrics.succeeded(used.credits, used.incoming_messages, used.outgoing_messages))
        return result

    def _admit(self) -> tuple[Optional[int], bool, bool]:
        """(slot taken or None, admitted, whether the budget has a credit rate): a slot first (premium),
        then a positive balance."""
        if self.lease is not None:
            self.lease.check()
        admitted, budget = self.ledger.admits()
        limited = budget.credits_per_second is not None
        if not admitted or budget.concurrency is None:
            return None, admitted, limited
        slot = self.slots.take(budget.concurrency)
        return slot, slot is not None, limited


def set_budget(root: str, budget: Budget) -> None:
    """Write the namespace's budget (create_namespace, update_namespace): on object storage this machine's
    share of it (other machines take theirs at their next renewal)."""
    ledger = Ledger(root, lambda: budget)
    try:
        if location.is_local(root):
            ledger.set_budget(budget)
        else:
            renew_share(root, budget, ledger)
    finally:
        ledger.close()
