"""Receiver delete_messages and purge_messages (the SDK's batch delete): which messages go, and what stays."""
from __future__ import annotations


import pytest

from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue


def _send(client, queue: str, bodies: list[str], **kwargs) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b, **kwargs) for b in bodies])


def test_delete_takes_the_oldest_unlocked_messages_and_purge_the_rest(admin, client):
    admin.create_queue("q", enable_partitioning=False)
    _send(client, "q", [f"m{i}" for i in range(10)])
    with client.get_queue_receiver("q") as receiver:
        locked = receiver.receive_messages(2, max_wait_time=2)  # m0, m1: locked, not eligible
        [deferred] = receiver.receive_messages(1, max_wait_time=2)
        receiver.defer_message(deferred)  # m2: deferred, stays
        assert receiver.delete_messages(max_message_count=3) == 3  # m3, m4, m5
        assert [str(m) for m in receiver.peek_messages(20, sequence_number=1)] == ["m0", "m1", "m2", "m6", "m7", "m8", "m9"]
        assert receiver.purge_messages() == 4
        assert [str(m) for m in receiver.peek_messages(20, sequence_number=1)] == ["m0", "m1", "m2"]
        receiver.complete_messages(locked)  # their locks were untouched
        [again] = receiver.receive_deferred_messages([deferred.sequence_number])
        assert again.body == b"m2"
        receiver.complete_message(again)
    assert admin.get_queue_runtime_properties("q").active_message_count == 0


def test_delete_honours_the_enqueued_time_cutoff_and_sub_queues(admin, client, clock):
    admin.create_queue("q")
    _send(client, "q", ["old1", "old2"])
    clock.advance(0.05)
    cutoff = clock.now()
    clock.advance(0.05)
    _send(client, "q", ["new"])
    with client.get_queue_receiver("q") as receiver:
        assert receiver.purge_messages(before_enqueued_time_utc=cutoff) == 2
        [new] = receiver.receive_messages(5, max_wait_time=2)
        assert str(new) == "new"
        receiver.dead_letter_message(new, reason="bad")
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead:
        assert dead.delete_messages(max_message_count=10) == 1
        assert dead.peek_messages(5) == []
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_a_session_receiver_deletes_only_its_session(admin, client):
    admin.create_queue("s", requires_session=True)
    _send(client, "s", ["a1", "a2"], session_id="a")
    _send(client, "s", ["b1"], session_id="b")
    with client.get_queue_receiver("s", session_id="a") as receiver:
        assert receiver.purge_messages() == 2
    with client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as receiver:
        assert receiver.session.session_id == "b"
        assert [str(m) for m in receiver.receive_messages(5)] == ["b1"]


def test_bad_arguments_delete_nothing(admin, client):
    admin.create_queue("q")
    _send(client, "q", ["x"])
    with client.get_queue_receiver("q") as receiver:
        for bad in (0, 4001, "3", True, None):
            with pytest.raises(ValueError, match="max_message_count must be an int from 1 to 4000"):
                receiver.delete_messages(max_message_count=bad)
        with pytest.raises(TypeError, match="before_enqueued_time_utc must be a datetime"):
            receiver.delete_messages(max_message_count=1, before_enqueued_time_utc="2026-01-01")
        with pytest.raises(TypeError):
            receiver.delete_messages(5)  # keyword-only, as in the SDK
    assert admin.get_queue_runtime_properties("q").active_message_count == 1
