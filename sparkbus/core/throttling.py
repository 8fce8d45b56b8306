"""Throttling rules (pure): what each operation costs, the credit bucket of a period, and the budgets of
the tiers.

Standard and basic (credit-based, from the seeds): a namespace gets `credits_per_second` credits at the
start of each one-second period. Send, receive and peek cost 1 credit per message; management operations
(create, read, update, delete of queues, topics, subscriptions and rules) cost 10; every filter evaluated
for a message sent to a topic costs 1. An operation is admitted while the balance is positive and may
drive it negative; the debt is repaid from the following periods, each adding `credits_per_second` up to
a full bucket. So a 5,000-credit DataFrame send goes through at once and then the namespace waits about
five seconds: bulk work is slowed, never starved.

Premium (dedicated resources): no credit limit, but a resource governor admits what the namespace's
messaging units can serve. Its model, in the same units so the tiers compare directly: each messaging
unit serves PREMIUM_CREDITS_PER_UNIT credits per second (the same bucket rule) and at most
PREMIUM_CONCURRENCY_PER_UNIT operations in flight at once across all processes. 1 MU is four times a
default standard namespace; every added unit adds the same capacity, so 2 MU admit twice the rate.

Periods are wall-clock seconds (the integer part of the Unix time), so every process of a machine
agrees on where a period starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

THROTTLED_TEXT = ("The request was terminated because the entity is being throttled. Error code: 50009. "
                  "Please wait 2 seconds and try again.")
DATA_COST = 1          # per message sent, received or peeked
MANAGEMENT_COST = 10   # per create, read, update or delete of an entity or rule
FILTER_COST = 1        # per filter evaluated for a message sent to a topic
DEFAULT_CREDITS_PER_SECOND = 1000
PREMIUM_CREDITS_PER_UNIT = 4000
PREMIUM_CONCURRENCY_PER_UNIT = 32


@dataclass(frozen=True)
class Budget:
    """What a namespace may do: credits per one-second period (None: unlimited) and operations in flight
    at once (None: unlimited)."""

    credits_per_second: Optional[int]
    concurrency: Optional[int]


def budget(tier: str, credits_per_second: Optional[int], messaging_units: int) -> Budget:
    """The budget of a namespace: the credit budget in basic and standard, the governor's in premium."""
    if tier == "premium":
        return Budget(PREMIUM_CREDITS_PER_UNIT * messaging_units, PREMIUM_CONCURRENCY_PER_UNIT * messaging_units)
    return Budget(credits_per_second, None)


@dataclass(frozen=True)
class Bucket:
    """The credit balance at the start of `period` (after that period's replenishment)."""

    period: int
    balance: int


def replenished(bucket: Bucket, period: int, credits_per_second: int) -> Bucket:
    """The bucket at `period`: one replenishment per period passed, never above a full bucket. A bucket
    from a later period (a clock stepped back) is kept as it is."""
    if period <= bucket.period:
        return bucket
    passed = period - bucket.period
    return Bucket(period, min(credits_per_second, bucket.balance + passed * credits_per_second))


def admits(bucket: Bucket) -> bool:
    """An operation is admitted while the balance is positive."""
    return bucket.balance > 0


def periods_until_admitted(bucket: Bucket, credits_per_second: int) -> int:
    """How many period starts from the bucket's period until its balance is positive (0: it is now)."""
    if bucket.balance > 0:
        return 0
    return (credits_per_second - bucket.balance) // credits_per_second


def share(budget: Budget, machines: int) -> Budget:
    """One machine's part of a namespace's budget when `machines` machines hold a live lease on it (object
    storage): each limit divided, rounded up so that no limit reaches zero. ValueError for machines < 1."""
    if machines < 1:
        raise ValueError(f"a budget is shared by at least 1 machine, got {machines}")

    def part(limit: Optional[int]) -> Optional[int]:
        return None if limit is None else -(-limit // machines)

    return Budget(part(budget.credits_per_second), part(budget.concurrency))


def charged(bucket: Bucket, credits: int) -> Bucket:
    """The bucket after an admitted operation used `credits` (the balance may go negative)."""
    return Bucket(bucket.period, bucket.balance - credits)


def data_cost(messages: int) -> int:
    return DATA_COST * messages


def filter_cost(messages: int, filters: int) -> int:
    return FILTER_COST * messages * filters
