"""Each operation on an object store (Azurite and S3) within its budget of storage requests, counted by the
storage layer (sparkbus.storage.requests): how many requests it waits for one after another ("sequential":
its latency on a cloud store is about that many round trips) and how many it sends. Counted, not timed, so
the budgets are exact; each is the least of three runs, since a client looks at the catalog at most once a
second (a run that falls on that look pays one request more)."""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Callable, TypeVar

import pytest

import sparkbus
from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from sparkbus.engine import clock, fanout, forwarding, registry
from sparkbus.engine.catalog import Catalog
from sparkbus.engine.registry import resolve
from sparkbus.storage import requests

BODY = b"x" * 1024
T = TypeVar("T")
pytestmark = pytest.mark.slow


@pytest.fixture(params=["azurite", "s3"])
def ns(request):
    path = f"{request.getfixturevalue(request.param)}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(path, credits_per_second=None)
    return path


def least(operation: Callable[[], object], prepare: Callable[[], object] = lambda: None,
          runs: int = 3) -> requests.Tally:
    """The tally of the run of operation (after prepare, not counted) with the fewest sequential requests."""
    tallies = []
    for _ in range(runs):
        prepare()
        with requests.counting() as tally:
            operation()
        tallies.append(tally)
    return min(tallies, key=lambda t: (t.sequential, t.requests))


def test_sending_receiving_settling_and_peeking_stay_within_their_budgets(ns):
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True)
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("q") as sender, \
            client.get_queue_receiver("q", max_wait_time=5) as receiver:
        for _ in range(3):
            sender.send_messages([ServiceBusMessage(BODY) for _ in range(200)])
        receiver.complete_messages(receiver.receive_messages(5))  # the views are read: the receiver is warm

        # a commit is a data file and then its log entry; the look at the catalog that confirms the entity
        # goes out beside the data file
        one = least(lambda: sender.send_messages(ServiceBusMessage(BODY)))
        assert (one.sequential, one.requests, one.delta_calls) == (2, 3, 0), one
        batch = least(lambda: sender.send_messages([ServiceBusMessage(BODY) for _ in range(200)]))
        assert batch.sequential == 2 and batch.requests <= 16 + 2 and batch.delta_calls == 0, batch  # 16 files at once

        # a receive from the messages the views hold (the backlog), then its settlement: two commits
        taken = least(lambda: receiver.complete_message(receiver.receive_messages(1)[0]))
        assert taken.sequential <= 4 and taken.delta_calls == 0, taken
        # 200 messages over 16 partitions: one commit to lock them, one to complete them
        many = least(lambda: receiver.complete_messages(receiver.receive_messages(200)))
        assert many.sequential <= 5 and many.delta_calls == 0, many
        # a message sent since (by this process: its view learnt the commit), then its file
        fresh = least(lambda: receiver.complete_message(receiver.receive_messages(1)[0]),
                      prepare=lambda: sender.send_messages(ServiceBusMessage(BODY)))
        assert fresh.sequential <= 5 and fresh.delta_calls == 0, fresh

        peeked = least(lambda: receiver.peek_messages(10))
        assert peeked.sequential <= 2 and peeked.delta_calls == 0, peeked
        for settle in (receiver.abandon_message, receiver.defer_message, receiver.renew_message_lock,
                       lambda m: receiver.dead_letter_message(m, reason="budget")):
            held: list = []  # a message received (not counted) before each run
            settled = least(lambda: settle(held[-1]), prepare=lambda: held.append(receiver.receive_messages(1)[0]))
            assert settled.sequential <= 2 and settled.delta_calls == 0, (settle, settled)
        later = clock.now() + timedelta(hours=1)
        scheduled = least(lambda: sender.schedule_messages(ServiceBusMessage(BODY), later))
        assert scheduled.sequential == 2 and scheduled.delta_calls == 0, scheduled


def test_a_write_slower_than_the_confirm_window_is_confirmed_after_it(ns, monkeypatch):
    """The look at the catalog sent beside a write vouches for it only when the write ended within
    CONFIRM_WINDOW_SECONDS of sending it; past that the look is made again after the write (with a window
    of nothing, every time): a send then waits for three requests."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True)
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage(BODY))
        monkeypatch.setattr(registry, "CONFIRM_WINDOW_SECONDS", 0.0)
        one = least(lambda: sender.send_messages(ServiceBusMessage(BODY)))
        assert (one.sequential, one.requests, one.kinds) == (3, 4, {"GET": 2, "PUT": 2}), one


def test_runtime_properties_cost_the_same_for_one_queue_and_for_fifty(ns):
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    for i in range(50):
        admin.create_queue(f"q{i:02d}", enable_partitioning=i < 2)
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("q00") as sender:
        sender.send_messages([ServiceBusMessage(BODY) for _ in range(100)])
    list(admin.list_queues_runtime_properties())  # each table read once in this process
    one = least(lambda: admin.get_queue_runtime_properties("q00"))
    assert one.sequential <= 3 and one.delta_calls == 0, one  # the catalog, the logs, no file changed
    assert admin.get_queue_runtime_properties("q00").active_message_count == 100
    fifty = least(lambda: admin.list_queues_runtime_properties())
    assert fifty.sequential <= 3 and fifty.delta_calls == 0, fifty  # 50 entities side by side
    assert fifty.requests >= 50 * 2  # each entity's two logs were looked at
    counts = {q.name: q.active_message_count for q in admin.list_queues_runtime_properties()}
    assert counts["q00"] == 100 and sum(counts.values()) == 100


def test_budgets_do_not_grow_with_the_log(ns):
    """After 60 more commits (and the checkpoints and log cleanup they bring), a send and a receive with its
    settlement wait for as many requests as before."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True)
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("q") as sender, \
            client.get_queue_receiver("q", max_wait_time=5) as receiver:
        sender.send_messages([ServiceBusMessage(BODY) for _ in range(200)])
        receiver.complete_messages(receiver.receive_messages(5))

        def measured() -> tuple[int, int]:
            send = least(lambda: sender.send_messages(ServiceBusMessage(BODY)))
            take = least(lambda: receiver.complete_message(receiver.receive_messages(1)[0]))
            return send.sequential, take.sequential
        before = measured()
        for _ in range(30):
            sender.send_messages(ServiceBusMessage(BODY))
            receiver.complete_message(receiver.receive_messages(1)[0])
        assert measured() == before


def test_a_session_receive_stays_within_its_budget(ns):
    """Accepting the next available session, receiving and completing its message, closing the receiver
    (which releases the session): no delta-rs call. Accepting is the catalog's look for the new receiver and
    the session lock's commit, chosen on the views the process read lately; each commit is confirmed by a
    look sent beside it."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("s", enable_partitioning=True, requires_session=True)
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("s") as sender:
        tallies: dict[str, list[requests.Tally]] = {"accept": [], "receive": [], "complete": [], "close": []}

        def counted(part: str, call: Callable[[], T]) -> T:
            with requests.counting() as tally:
                result = call()
            tallies[part].append(tally)
            return result

        for i in range(4):
            sender.send_messages(ServiceBusMessage(BODY, session_id=f"s{i}"))
            receiver = counted("accept", lambda: client.get_queue_receiver(
                "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5))
            message = counted("receive", lambda: receiver.receive_messages(1))[0]
            assert message.session_id == f"s{i}"
            counted("complete", lambda: receiver.complete_message(message))
            counted("close", receiver.close)
        least = {part: min((t.sequential for t in found[1:]), default=None) for part, found in tallies.items()}
        assert least == {"accept": 3, "receive": 2, "complete": 2, "close": 2}, least
        assert not any(t.delta_calls for found in tallies.values() for t in found[1:])


def test_management_costs_do_not_grow_with_partitions_or_subscriptions(ns):
    """Creating a queue of sixteen partitions waits for as many requests as one of one (its three tables are
    created side by side, empty), and deleting a topic with four subscriptions for as many as one with one
    (their directories are removed side by side)."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)

    def created(name: str, partitioned: bool) -> requests.Tally:
        with requests.counting() as tally:
            admin.create_queue(name, enable_partitioning=partitioned)
        return tally

    created("first", False)  # then each creation below finds the catalog moved by the one before
    one, sixteen = created("one", False), created("sixteen", True)
    assert (sixteen.sequential, sixteen.requests) == (one.sequential, one.requests), (one, sixteen)

    def topic_deleted(name: str, subscriptions: int) -> requests.Tally:
        admin.create_topic(name)
        for i in range(subscriptions):
            admin.create_subscription(name, f"s{i}")
        with requests.counting() as tally:
            admin.delete_topic(name)
        return tally

    few, many = topic_deleted("few", 1), topic_deleted("many", 4)
    assert many.sequential == few.sequential, (few, many)
    assert many.requests > few.requests  # the other subscriptions' directories were removed too


def test_fan_out_and_forwarding_passes_cost_the_same_for_one_partition_or_sixteen(ns):
    """A fan-out pass reads the topic's cursors from one read of its log and delivers to its subscriptions
    side by side; a forwarding pass claims, copies and releases every partition's batch in one commit each:
    over sixteen partitions they wait for as many requests as over one."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    catalog = Catalog(ns)
    passes: dict[str, dict[bool, requests.Tally]] = {"fan-out": {}, "forwarding": {}}
    with sparkbus.ServiceBusClient(ns) as client:
        for partitioned in (False, True):
            name = "16" if partitioned else "1"
            admin.create_topic(f"t{name}", enable_partitioning=partitioned)
            for s in ("a", "b"):
                admin.create_subscription(f"t{name}", s)
            admin.create_queue(f"d{name}", enable_partitioning=partitioned)
            admin.create_queue(f"f{name}", enable_partitioning=partitioned, forward_to=f"d{name}")
            for sender in (client.get_topic_sender(f"t{name}"), client.get_queue_sender(f"f{name}")):
                with sender:  # a send goes to one partition, the next to the next: 16 sends, 16 partitions
                    for _ in range(16):
                        sender.send_messages([ServiceBusMessage(BODY) for _ in range(4)])
            with requests.counting() as fanned:
                assert fanout.drain(catalog, f"t{name}").messages == 64
            snap = catalog.snapshot()
            with requests.counting() as forwarded:
                result = forwarding.forward_entity(catalog, snap, resolve(catalog.root, snap, f"f{name}", ("queue",)))
            assert result.forwarded == {f"f{name}": 64}
            passes["fan-out"][partitioned], passes["forwarding"][partitioned] = fanned, forwarded
    for kind, tallies in passes.items():
        one, sixteen = tallies[False], tallies[True]
        assert sixteen.sequential <= one.sequential + 2, (kind, one, sixteen)
