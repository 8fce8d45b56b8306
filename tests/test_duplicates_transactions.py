"""Duplicate detection and transactions."""
from __future__ import annotations


import pytest
from conftest import stored_messages

from sparkbus import InvalidOperationError, ServiceBusMessage


def test_duplicates_in_one_call_and_across_calls(admin, client):
    admin.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    sender = client.get_queue_sender("dd")
    sender.send_messages([ServiceBusMessage("a1", message_id="a"), ServiceBusMessage("b", message_id="b"),
                          ServiceBusMessage("a2", message_id="a")])
    sender.send_messages([ServiceBusMessage("a3", message_id="a"), ServiceBusMessage("c", message_id="c")])
    other = client.get_queue_sender("dd")
    other.send_messages(ServiceBusMessage("b2", message_id="b"))
    rows = stored_messages(admin, "dd").to_pylist()
    assert sorted((r["message_id"], r["body"]) for r in rows) == [("a", b"a1"), ("b", b"b"), ("c", b"c")]
    assert admin.get_queue_runtime_properties("dd").active_message_count == 3


def test_without_duplicate_detection_ids_repeat(admin, client):
    admin.create_queue("plain")
    client.get_queue_sender("plain").send_messages([ServiceBusMessage("x", message_id="a")] * 2)
    assert stored_messages(admin, "plain").num_rows == 2


@pytest.mark.slow
def _age(admin, entity: str, seconds: int) -> None:
    """Make the entity's stored messages `seconds` older (a real Delta update of enqueued_time_utc): the
    history window is read from that column, so this is what waiting would do, without the wait."""
    from sparkbus import storage

    storage.open_table(admin.get_entity_tables(entity)["messages"]).update(
        updates={"enqueued_time_utc": f"enqueued_time_utc - INTERVAL '{seconds} seconds'"})


def test_history_window_bounds_detection(admin, client):
    admin.create_queue("w", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT20S")
    sender = client.get_queue_sender("w")
    sender.send_messages(ServiceBusMessage("first", message_id="same"))
    sender.send_messages(ServiceBusMessage("dup", message_id="same"))
    _age(admin, "w", 18)
    sender.send_messages(ServiceBusMessage("still in the window", message_id="same"))
    _age(admin, "w", 3)  # 21 seconds old now
    sender.send_messages(ServiceBusMessage("after the window", message_id="same"))
    assert stored_messages(admin, "w")["body"].to_pylist() == [b"first", b"after the window"]


def test_transaction_commits_atomically_at_exit(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    sender = client.get_queue_sender("q")
    with client.transaction() as txn:
        sender.send_messages(ServiceBusMessage("1", partition_key="k"), transaction=txn)
        sender.send_messages([ServiceBusMessage("2", partition_key="k"), ServiceBusMessage("3", partition_key="k")],
                             transaction=txn)
        assert stored_messages(admin, "q").num_rows == 0  # nothing visible before the block ends
    rows = stored_messages(admin, "q")
    assert rows["body"].to_pylist() == [b"1", b"2", b"3"] and len(set(rows["partition_id"].to_pylist())) == 1
    with pytest.raises(InvalidOperationError, match="transaction has ended"):
        sender.send_messages(ServiceBusMessage("late", partition_key="k"), transaction=txn)


def test_transaction_discarded_when_block_raises(admin, client):
    admin.create_queue("q")
    sender = client.get_queue_sender("q")
    with pytest.raises(RuntimeError):
        with client.transaction() as txn:
            sender.send_messages(ServiceBusMessage("never"), transaction=txn)
            raise RuntimeError("handler failed")
    assert stored_messages(admin, "q").num_rows == 0


def test_transaction_rules_on_partitioned_entities(admin, client):
    admin.create_queue("p", enable_partitioning=True)
    admin.create_queue("sessions", enable_partitioning=True, requires_session=True)
    admin.create_queue("flat")
    admin.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    p, s = client.get_queue_sender("p"), client.get_queue_sender("sessions")
    with client.transaction() as txn:
        with pytest.raises(InvalidOperationError, match="need a partition key"):
            p.send_messages(ServiceBusMessage("no key"), transaction=txn)
        p.send_messages(ServiceBusMessage("k1", partition_key="k1"), transaction=txn)
        with pytest.raises(InvalidOperationError, match="same partition key"):
            p.send_messages(ServiceBusMessage("k2", partition_key="k2"), transaction=txn)
        with pytest.raises(InvalidOperationError, match="spans one entity"):
            client.get_queue_sender("flat").send_messages(ServiceBusMessage("x"), transaction=txn)
    assert stored_messages(admin, "p")["body"].to_pylist() == [b"k1"]
    with client.transaction() as txn:
        s.send_messages(ServiceBusMessage("a", session_id="s1"), transaction=txn)
        with pytest.raises(InvalidOperationError, match="same partition key \\(or session\\)"):
            s.send_messages(ServiceBusMessage("b", session_id="s2"), transaction=txn)
    with client.transaction() as txn:  # non-partitioned entities take any messages
        client.get_queue_sender("flat").send_messages([ServiceBusMessage("x"), ServiceBusMessage("y", session_id="z")],
                                                      transaction=txn)
    with client.transaction() as txn:  # with duplicate detection the message id is the key
        client.get_queue_sender("dd").send_messages(ServiceBusMessage("m", message_id="id-1"), transaction=txn)
    assert stored_messages(admin, "flat").num_rows == 2 and stored_messages(admin, "dd").num_rows == 1
