"""Stale handles across delete and re-create of an entity: a lock token, a deferred or scheduled sequence
number, a session lock and a sender belong to one incarnation of their entity. Used after it was deleted
(created again or not) they raise the handle's error and touch nothing: the new incarnation's messages keep
their delivery count and state, and no file under the namespace changes. Each case runs twice when the
queue was created again: at once (the handle's cached settings still name the deleted incarnation, whose
directory is gone) and after the settings were re-read. Deleting a queue while 8 threads send to it gives
every sender a typed error, leaves no file of the deleted queue, and loses no acknowledged message."""
from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import sparkbus
from sparkbus import (CommitConflictError, MessageLockLostError, MessageNotFoundError, MessagingEntityNotFoundError, ServiceBusMessage,
                      ServiceBusMessageState, ServiceBusSubQueue, SessionLockLostError)
from sparkbus.engine import registry
from sparkbus.engine.registry import SETTINGS_REFRESH_SECONDS
from sparkbus.storage import location
from conftest import files_under, wait_until

OUTCOMES = ["recreated", "recreated-after-refresh", "deleted"]


def entity_directories(ns_path: str) -> dict[str, list[str]]:
    """The incarnation directories (entities/<id>) that hold any file, with their files."""
    found: dict[str, list[str]] = {}
    for name in files_under(ns_path):
        parts = name.strip("/").split("/")
        if parts[0] == "entities":
            found.setdefault(parts[1], []).append("/".join(parts[2:]))
    return found


def replace_queue(admin, name: str, outcome: str, clock, **options) -> None:
    """Delete the queue; unless outcome is "deleted", create it again (with options); after
    "recreated-after-refresh", move the clock past the time clients re-read entity settings."""
    admin.delete_queue(name)
    if outcome != "deleted":
        admin.create_queue(name, **options)
    if outcome == "recreated-after-refresh":
        clock.advance(SETTINGS_REFRESH_SECONDS + 0.05)


def shown(client, queue: str, **receiver_options) -> list[tuple]:
    """(body, sequence number, delivery count, state) of every message, peeked partition by partition."""
    peeker, found = client.get_queue_receiver(queue, **receiver_options), []
    while True:
        page = peeker.peek_messages(max_message_count=1000)
        if not page:
            return sorted(found, key=lambda row: row[1])
        found += [(str(m), m.sequence_number, m.delivery_count, m.state) for m in page]


# ---- message locks ---------------------------------------------------------------------------------------

SETTLEMENTS = {
    "complete": lambda receiver, messages: receiver.complete_message(messages[0]),
    "complete_messages": lambda receiver, messages: receiver.complete_messages(messages),
    "abandon": lambda receiver, messages: receiver.abandon_message(messages[0]),
    "defer": lambda receiver, messages: receiver.defer_message(messages[0]),
    "dead_letter": lambda receiver, messages: receiver.dead_letter_message(messages[0], reason="stale"),
    "renew_message_lock": lambda receiver, messages: receiver.renew_message_lock(messages[0]),
}


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("settle", sorted(SETTLEMENTS))
def test_a_lock_of_a_deleted_queue_is_lost_and_touches_nothing(admin, client, ns_path, settle, outcome, clock):
    admin.create_queue("x", enable_partitioning=True)
    old = [ServiceBusMessage(f"old-{i}", partition_key=f"k{i}") for i in range(4)]  # in several partitions
    client.get_queue_sender("x").send_messages(old)
    receiver = client.get_queue_receiver("x")
    messages = receiver.receive_messages(max_message_count=4)
    assert len(messages) == 4 and len({m._partition_id for m in messages}) > 1
    replace_queue(admin, "x", outcome, clock, enable_partitioning=True)
    if outcome != "deleted":  # the same numbers again: what a lock of the deleted queue would have hit
        client.get_queue_sender("x").send_messages(
            [ServiceBusMessage(f"new-{i}", partition_key=f"k{i}") for i in range(4)])
        new = shown(client, "x")
        assert {n for _, n, _, _ in new} == {m.sequence_number for m in messages}
    before = files_under(ns_path)
    with pytest.raises(MessageLockLostError, match="deleted"):
        SETTLEMENTS[settle](receiver, messages)
    assert files_under(ns_path) == before
    if outcome == "deleted":
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages(max_message_count=1)
        assert entity_directories(ns_path) == {}
        return
    assert shown(client, "x") == new and all(count == 0 and state == ServiceBusMessageState.ACTIVE
                                             for _, _, count, state in new)
    assert shown(client, "x", sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []
    again = receiver.receive_messages(max_message_count=4, max_wait_time=5)  # reconnected to the new queue
    assert sorted(str(m) for m in again) == [f"new-{i}" for i in range(4)]
    assert all(m.delivery_count == 1 for m in again)
    receiver.complete_messages(again)
    assert shown(client, "x") == []


def test_prefetched_messages_of_a_deleted_queue_are_dropped(admin, client, clock):
    admin.create_queue("x")
    client.get_queue_sender("x").send_messages([ServiceBusMessage(f"old-{i}") for i in range(3)])
    receiver = client.get_queue_receiver("x", prefetch_count=5)
    assert [str(m) for m in receiver.receive_messages(max_message_count=1)] == ["old-0"]
    replace_queue(admin, "x", "recreated", clock)
    client.get_queue_sender("x").send_messages(ServiceBusMessage("new"))
    assert [str(m) for m in receiver.receive_messages(max_message_count=5, max_wait_time=5)] == ["new"]


# ---- deferred sequence numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("outcome", OUTCOMES)
def test_deferred_numbers_of_a_deleted_queue_name_nothing_in_the_new_one(admin, client, ns_path, outcome, clock):
    admin.create_queue("x")
    client.get_queue_sender("x").send_messages(ServiceBusMessage("old"))
    receiver = client.get_queue_receiver("x")
    old = receiver.receive_messages(max_message_count=1)[0]
    receiver.defer_message(old)
    replace_queue(admin, "x", outcome, clock)
    if outcome == "deleted":
        before = files_under(ns_path)
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_deferred_messages([old.sequence_number])
        assert files_under(ns_path) == before
        return
    client.get_queue_sender("x").send_messages(ServiceBusMessage("new"))  # deferred under the same number
    other = client.get_queue_receiver("x", max_wait_time=5)
    new = other.receive_messages(max_message_count=1)[0]
    other.defer_message(new)
    assert new.sequence_number == old.sequence_number
    before, shown_before = files_under(ns_path), shown(client, "x")
    assert shown_before == [("new", new.sequence_number, 1, ServiceBusMessageState.DEFERRED)]
    with pytest.raises(MessageNotFoundError, match="deleted and created again"):
        receiver.receive_deferred_messages([old.sequence_number])
    assert files_under(ns_path) == before and shown(client, "x") == shown_before
    assert other.receive_deferred_messages([new.sequence_number])[0].delivery_count == 2


# ---- sessions ----------------------------------------------------------------------------------------------

SESSION_OPERATIONS = {  # (receiver, the message it holds) -> a session operation
    "get_state": lambda receiver, held: receiver.session.get_state(),
    "set_state": lambda receiver, held: receiver.session.set_state(b"stale"),
    "renew_lock": lambda receiver, held: receiver.session.renew_lock(),
    "receive_messages": lambda receiver, held: receiver.receive_messages(max_message_count=1),
    "complete_message": lambda receiver, held: receiver.complete_message(held),
    "receive_deferred_messages": lambda receiver, held: receiver.receive_deferred_messages([held.sequence_number]),
    "peek_messages": lambda receiver, held: receiver.peek_messages(max_message_count=5),
}


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("operation", sorted(SESSION_OPERATIONS))
def test_a_session_of_a_deleted_queue_is_lost_and_touches_nothing(admin, client, ns_path, operation, outcome, clock):
    admin.create_queue("s", requires_session=True)
    client.get_queue_sender("s").send_messages([ServiceBusMessage(f"old-{i}", session_id="a") for i in range(2)])
    receiver = client.get_queue_receiver("s", session_id="a")
    receiver.session.set_state(b"old state")
    held = receiver.receive_messages(max_message_count=1)[0]
    replace_queue(admin, "s", outcome, clock, requires_session=True)
    if outcome != "deleted":
        client.get_queue_sender("s").send_messages([ServiceBusMessage(f"new-{i}", session_id="a") for i in range(2)])
        new = shown(client, "s")
        assert [(body, count) for body, _, count, _ in new] == [("new-0", 0), ("new-1", 0)]
    before = files_under(ns_path)
    with pytest.raises(SessionLockLostError, match="deleted"):
        SESSION_OPERATIONS[operation](receiver, held)
    receiver.close()  # releasing the lost session touches nothing either
    assert files_under(ns_path) == before
    if outcome == "deleted":
        return
    assert shown(client, "s") == new
    fresh = client.get_queue_receiver("s", session_id="a")  # the new queue's session "a" was never locked
    assert fresh.session.get_state() is None
    got = fresh.receive_messages(max_message_count=2)
    assert [(str(m), m.delivery_count) for m in got] == [("new-0", 1), ("new-1", 1)]


def test_a_session_taken_in_the_new_queue_keeps_its_lock_and_state(admin, client, ns_path, clock):
    admin.create_queue("s", requires_session=True)
    client.get_queue_sender("s").send_messages(ServiceBusMessage("old", session_id="a"))
    stale = client.get_queue_receiver("s", session_id="a")
    replace_queue(admin, "s", "recreated", clock, requires_session=True)
    client.get_queue_sender("s").send_messages(ServiceBusMessage("new", session_id="a"))
    holder = client.get_queue_receiver("s", session_id="a")
    holder.session.set_state(b"new state")
    locked_until = holder.session.locked_until_utc
    before = files_under(ns_path)
    for operation in ("get_state", "set_state", "renew_lock", "receive_messages"):
        with pytest.raises(SessionLockLostError):
            SESSION_OPERATIONS[operation](stale, None)
    assert files_under(ns_path) == before
    assert holder.session.get_state() == b"new state" and holder.session.locked_until_utc == locked_until
    assert [str(m) for m in holder.receive_messages(max_message_count=1)] == ["new"]


# ---- senders -------------------------------------------------------------------------------------------------

def test_a_sender_of_a_deleted_queue_raises_not_found_and_writes_nothing(admin, client, ns_path):
    admin.create_queue("x")
    sender = client.get_queue_sender("x")
    sender.send_messages(ServiceBusMessage("old"))
    admin.delete_queue("x")
    before = files_under(ns_path)
    for send in (lambda: sender.send_messages(ServiceBusMessage("lost")),
                 lambda: sender.schedule_messages(ServiceBusMessage("lost"),
                                                  datetime.now(timezone.utc) + timedelta(hours=1))):
        with pytest.raises(MessagingEntityNotFoundError, match="'x'"):
            send()
    assert files_under(ns_path) == before and entity_directories(ns_path) == {}


@pytest.mark.parametrize("outcome", ["recreated", "recreated-after-refresh"])
def test_a_sender_follows_a_queue_created_again(admin, client, ns_path, outcome, clock):
    admin.create_queue("x")
    sender = client.get_queue_sender("x")
    sender.send_messages(ServiceBusMessage("old"))
    replace_queue(admin, "x", outcome, clock, max_delivery_count=3)
    directories = set(entity_directories(ns_path))
    assert len(directories) == 1
    sender.send_messages(ServiceBusMessage("new"))
    sender.send_messages([ServiceBusMessage("batch-0"), ServiceBusMessage("batch-1")])
    assert [body for body, _, _, _ in shown(client, "x")] == ["new", "batch-0", "batch-1"]
    assert set(entity_directories(ns_path)) == directories  # nothing written where the deleted queue was
    assert sender.entity_info().options.max_delivery_count == 3


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_scheduled_numbers_of_a_deleted_queue_cancel_nothing(admin, client, ns_path, outcome, clock):
    admin.create_queue("x")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    sender = client.get_queue_sender("x")
    old = sender.schedule_messages(ServiceBusMessage("old"), later)
    replace_queue(admin, "x", outcome, clock)
    if outcome == "deleted":
        before = files_under(ns_path)
        with pytest.raises(MessagingEntityNotFoundError):
            sender.cancel_scheduled_messages(old)
        assert files_under(ns_path) == before
        return
    new = client.get_queue_sender("x").schedule_messages(ServiceBusMessage("new"), later)
    assert new == old
    before, shown_before = files_under(ns_path), shown(client, "x")
    with pytest.raises(MessageNotFoundError, match="deleted and created again"):
        sender.cancel_scheduled_messages(old)
    assert files_under(ns_path) == before and shown(client, "x") == shown_before
    assert shown_before == [("new", new[0], 0, ServiceBusMessageState.SCHEDULED)]


# ---- deleting a queue while threads send to it ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "recreated"])
@pytest.mark.parametrize("senders", [1, 8], ids=["one-shared-sender", "a-client-each"])
def test_deleting_a_queue_while_8_threads_send_to_it(admin, ns_path, senders, recreate):
    """Every send succeeds or raises a ServiceBusError: not found once the queue is gone (the last error
    of each thread when it stays gone), or busy (8 senders race for one partition, delete or not); no file
    of the deleted queue remains; a send that started after the queue was created again is in the new
    queue, which holds only acknowledged messages."""
    admin.create_queue("x")
    shared = sparkbus.ServiceBusClient(ns_path).get_queue_sender("x")
    threads_senders = [shared if senders == 1 else sparkbus.ServiceBusClient(ns_path).get_queue_sender("x")
                       for _ in range(8)]
    deleted, recreated, stop = threading.Event(), threading.Event(), threading.Event()
    acked: list[tuple[str, bool]] = []  # (message id, whether its send started after the re-create)
    errors: list[BaseException] = []

    def send(index: int) -> None:
        while not stop.is_set():
            started_after = recreated.is_set()
            message_id = uuid.uuid4().hex
            try:
                threads_senders[index].send_messages(ServiceBusMessage("m", message_id=message_id))
            except Exception as error:  # anything else than a ServiceBusError fails the test below
                errors.append(error)
                if deleted.is_set() and not recreate and isinstance(error, MessagingEntityNotFoundError):
                    return
                continue
            acked.append((message_id, started_after))

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: len(acked) >= 40, 120)
        admin.delete_queue("x")
        deleted.set()
        if recreate:
            admin.create_queue("x")
            recreated.set()
            assert wait_until(lambda: sum(started_after for _, started_after in acked) >= 24, 120)
            stop.set()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        stop.set()  # the threads end whatever failed
    assert not any(thread.is_alive() for thread in threads)
    assert len(acked) >= 40
    # not found, or (8 clients: 8 writers racing for one partition, delete or not) busy
    unexpected = {f"{type(error).__name__}: {error}" for error in errors
                  if not isinstance(error, (MessagingEntityNotFoundError, CommitConflictError))}
    assert not unexpected, sorted(unexpected)[:5]
    current = {admin.get_entity_tables("x")["messages"].rstrip("/").split("/")[-2]} if recreate else set()
    assert registry.wait_removed(timeout=60)  # the delete's second removal (object stores), made meanwhile
    left = entity_directories(ns_path)
    assert set(left) == current, left  # nothing of the deleted queue, nothing written after it
    if recreate:
        assert sum(started_after for _, started_after in acked) >= 24
        peeker, stored = sparkbus.ServiceBusClient(ns_path).get_queue_receiver("x"), set()
        while page := peeker.peek_messages(max_message_count=1000):
            stored |= {m.message_id for m in page}
        assert stored <= {message_id for message_id, _ in acked}
        assert {message_id for message_id, started_after in acked if started_after} <= stored


@pytest.mark.slow
@pytest.mark.parametrize("server", ["azurite", "s3"])
def test_a_write_landing_in_a_queue_being_deleted_goes_with_it(request, server, monkeypatch):
    """On an object store the look at the catalog that confirms a write goes out beside it and vouches for
    a write that ended within CONFIRM_WINDOW_SECONDS of it, so such a write can land in a deleted queue's
    directory after the delete's first removal. The delete removes the directory again
    REMOVAL_DELAY_SECONDS after its catalog commit (widened here to leave room), on a thread of its own
    that the delete does not wait for: a log entry written between the two removals is gone once the
    second removal is done."""
    monkeypatch.setattr(registry, "REMOVAL_DELAY_SECONDS", 5.0)
    ns = f"{request.getfixturevalue(server)}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("x")
    with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("x") as sender:
        sender.send_messages(ServiceBusMessage("before"))
    messages = admin.get_entity_tables("x")["messages"]
    incarnation = messages.rstrip("/").split("/")[-2]
    admin.delete_queue("x")
    assert incarnation not in entity_directories(ns)  # the first removal is done when the delete returns
    store, key = location.store_of(location.join(messages, "_delta_log", f"{99:020d}.json"))
    store.put(key, b'{"commitInfo":{}}', mode="create")  # a late write
    assert incarnation in entity_directories(ns)  # it landed between the removals
    assert registry.wait_removed(timeout=60)
    assert entity_directories(ns) == {}


@pytest.mark.slow
def test_deleting_a_queue_while_4_threads_receive_and_complete(admin, ns_path):
    """Receivers settling while their queue is deleted and created again get a lock or not-found error,
    never a raw one; no file of the deleted queue remains; and no message of the new queue is settled by a
    lock of the old one: each is either still there or was completed by a receiver that received it."""
    admin.create_queue("x", enable_partitioning=True)
    client = sparkbus.ServiceBusClient(ns_path)
    client.get_queue_sender("x").send_messages([ServiceBusMessage(f"old-{i}") for i in range(150)])
    stop, lock = threading.Event(), threading.Lock()
    completed: list[str] = []
    errors: list[BaseException] = []

    def work() -> None:
        receiver = sparkbus.ServiceBusClient(ns_path).get_queue_receiver("x")
        while not stop.is_set():
            try:
                for message in receiver.receive_messages(max_message_count=5):
                    receiver.complete_message(message)
                    with lock:
                        completed.append(str(message))
            except Exception as error:
                errors.append(error)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: len(completed) >= 20, 120)
        admin.delete_queue("x")
        admin.create_queue("x", enable_partitioning=True)
        client.get_queue_sender("x").send_messages([ServiceBusMessage(f"new-{i}") for i in range(100)])
        assert wait_until(lambda: sum(body.startswith("new") for body in completed) >= 20, 120)
    finally:
        stop.set()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    unexpected = {f"{type(error).__name__}: {error}" for error in errors
                  if not isinstance(error, (MessageLockLostError, MessagingEntityNotFoundError))}
    assert not unexpected, sorted(unexpected)[:5]
    current = admin.get_entity_tables("x")["messages"].rstrip("/").split("/")[-2]
    assert registry.wait_removed(timeout=60)
    left = entity_directories(ns_path)
    assert set(left) == {current}, left
    left = [body for body, _, _, _ in shown(client, "x")]
    done = [body for body in completed if body.startswith("new")]
    assert len(done) == len(set(done)) and sorted(left + done) == sorted(f"new-{i}" for i in range(100))


def test_peek_and_delete_messages_follow_a_queue_created_again(admin, client, clock):
    admin.create_queue("x")
    client.get_queue_sender("x").send_messages([ServiceBusMessage(f"old-{i}") for i in range(3)])
    receiver = client.get_queue_receiver("x")
    assert [str(m) for m in receiver.peek_messages(max_message_count=2)] == ["old-0", "old-1"]  # the cursor moved
    replace_queue(admin, "x", "recreated", clock)
    client.get_queue_sender("x").send_messages([ServiceBusMessage(f"new-{i}") for i in range(3)])
    assert [str(m) for m in receiver.peek_messages(max_message_count=2)] == ["new-0", "new-1"]  # from the start
    assert receiver.delete_messages(max_message_count=2) == 2
    assert [body for body, _, _, _ in shown(client, "x")] == ["new-2"]
