"""Auto-forwarding rules without I/O: the hop limit, transfer dead-letter reasons, forwarding cycles, and the
names of the claims and application transactions that make a transfer exactly-once
(sparkbus.engine.forwarding does the I/O)."""
from __future__ import annotations

from typing import Mapping, Optional

MAX_TRANSFER_HOPS = 4  # a message may be forwarded at most this many times (Service Bus: 4 hops)
HOP_LIMIT_REASON = "MaxTransferHopCountExceeded"
FORWARD = "forward"          # active messages -> forward_to
DEAD_LETTER = "deadletter"   # dead-lettered messages -> forward_dead_lettered_messages_to
KINDS = (FORWARD, DEAD_LETTER)
_CLAIM_PREFIX = "transfer:"
# The dead-letter reason and description travel with a message forwarded out of a dead-letter sub-queue
# as these application properties, as in Service Bus.
DEAD_LETTER_REASON_PROPERTY = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION_PROPERTY = "DeadLetterErrorDescription"


def hop_limit_description(hops: int, destination: str) -> str:
    return (f"The message was forwarded {hops} times; forwarding it to {destination!r} would exceed the limit "
            f"of {MAX_TRANSFER_HOPS} hops.")


def failure_reason(destination: str, error: str) -> str:
    """The transfer dead-letter reason when the destination refused a message: names both."""
    return f"Forwarding to {destination!r} failed: {error}"


def claim_token(kind: str, batch: int) -> str:
    """The lock token a forwarder's claim carries: which destination and which numbered batch."""
    return f"{_CLAIM_PREFIX}{kind}:{batch}"


def parse_claim(token: Optional[str]) -> Optional[tuple[str, int]]:
    """(kind, batch) of a claim token; None for any other lock token."""
    if not token or not token.startswith(_CLAIM_PREFIX):
        return None
    kind, _, batch = token[len(_CLAIM_PREFIX):].partition(":")
    return kind, int(batch)


CLAIM_SQL = f"lock_token LIKE '{_CLAIM_PREFIX}%'"


def claim_app_id(partition: int) -> str:
    """Application transaction on the source's locks table: the last batch number claimed there."""
    return f"sparkbus.transfer.claim.p{partition}"


def fanout_app_id(partition: int) -> str:
    """Application transaction on a subscription's and its topic's messages tables: the highest topic
    sequence number (low bits) of one topic partition fanned out (sparkbus.engine.fanout)."""
    return f"sparkbus.fanout.p{partition}"


def transfer_app_id(source_storage: str, partition: int) -> str:
    """Application transaction on a destination's messages table: the last batch of one source partition
    it received. source_storage names the source's tables, so a source deleted and created again under
    the same name starts afresh."""
    return f"sparkbus.transfer.{source_storage}.p{partition}"


def cycle(start: str, target: str, forwards: Mapping[str, str], delivers: Mapping[str, list[str]]) -> Optional[list[str]]:
    """The forwarding loop that setting start -> target would close, as the list of entity keys it runs
    through, or None. forwards: entity key -> forward_to key (the other entities' current settings);
    delivers: topic key -> its subscriptions' keys (a topic hands every message on to them)."""
    seen: set[str] = set()
    frontier = [(target, [start, target])]
    while frontier:
        node, path = frontier.pop()
        if node == start:
            return path
        if node in seen:
            continue
        seen.add(node)
        onward = list(delivers.get(node, []))
        if node in forwards:
            onward.append(forwards[node])
        frontier.extend((nxt, path + [nxt]) for nxt in onward)
    return None
