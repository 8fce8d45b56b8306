"""Scenarios of azure-servicebus' own samples, written as azure-servicebus code would be with only the
import changed: the SDK's constructor with a credential, its keywords, iteration of bodies, its
management errors. (Our own equivalents: nothing is downloaded.)"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ResourceNotFoundError

from sparkbus import ServiceBusClient, ServiceBusMessage, ServiceBusSender, ServiceBusSubQueue
from sparkbus.management import ServiceBusAdministrationClient


class Credential:
    """Stands for DefaultAzureCredential(): only get_token is ever asked of it."""

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        return AccessToken("token", 2**31)


@pytest.fixture
def sdk(admin, ns_path):
    """(client, admin) as the samples build them: fully qualified namespace + credential."""
    manager = ServiceBusAdministrationClient(ns_path, Credential())
    manager.create_queue("q", max_delivery_count=3)
    return ServiceBusClient(ns_path, Credential(), logging_enable=True), manager


def test_dead_letter_and_correct(sdk):
    client, _ = sdk
    with client.get_queue_sender(queue_name="q") as sender:
        sender.send_messages([ServiceBusMessage(f"Message number: {i}", subject="Bad" if i % 2 == 0 else "Good")
                              for i in range(10)])
    with client.get_queue_receiver(queue_name="q") as receiver:
        for msg in receiver.receive_messages(max_message_count=10, max_wait_time=5):
            if msg.subject == "Good":
                receiver.complete_message(msg)
            else:
                receiver.dead_letter_message(msg, reason="ProcessingError",
                                             error_description="Don't know what to do with this message.")
    corrected = []
    with client.get_queue_receiver(queue_name="q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        for msg in dlq.receive_messages(max_message_count=10, max_wait_time=5):
            assert (msg.dead_letter_reason, msg.subject) == ("ProcessingError", "Bad")
            corrected.append(ServiceBusMessage(next(msg.body), subject="Good"))  # the SDK's body iterator
            dlq.complete_message(msg)
    with client.get_queue_sender(queue_name="q") as sender:
        sender.send_messages(corrected)
    with client.get_queue_receiver(queue_name="q", max_wait_time=5) as receiver:
        got = receiver.receive_messages(max_message_count=10)
        assert sorted(str(m) for m in got) == [f"Message number: {i}" for i in range(0, 10, 2)]
        assert {m.subject for m in got} == {"Good"}
        receiver.complete_messages(got)


def test_exceeding_max_delivery_count_dead_letters(sdk):
    client, _ = sdk
    client.get_queue_sender("q").send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver(queue_name="q") as receiver:
        counts = []
        received = receiver.receive_messages(max_wait_time=1)
        while received:
            for msg in received:
                counts.append(msg.delivery_count)
                receiver.abandon_message(msg)
            received = receiver.receive_messages(max_wait_time=1)
    assert counts == [1, 2, 3]  # max_delivery_count=3
    with client.get_queue_receiver(queue_name="q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = dlq.receive_messages(max_wait_time=5)
        assert (str(dead), dead.dead_letter_reason) == ("poison", "MaxDeliveryCountExceeded")
        dlq.complete_message(dead)


def test_management_round_trip(sdk):
    _, manager = sdk
    manager.create_queue("orders", max_delivery_count=10, dead_lettering_on_message_expiration=True,
                         auto_delete_on_idle=timedelta(days=7), user_metadata="samples")
    props = manager.get_queue("orders")
    props.max_delivery_count = 20
    props.lock_duration = timedelta(seconds=45)
    manager.update_queue(props)
    props = manager.get_queue("orders")
    assert (props.max_delivery_count, props.lock_duration, props.user_metadata) == (20, timedelta(seconds=45),
                                                                                  "samples")
    runtime = {r.name: r for r in manager.list_queues_runtime_properties()}
    assert runtime["orders"].active_message_count == 0 and runtime["orders"].size_in_bytes == 0
    manager.delete_queue("orders")
    with pytest.raises(ResourceNotFoundError):  # what the samples catch
        manager.get_queue("orders")


def test_schedule_and_cancel_through_a_sender_built_from_a_connection_string(sdk, ns_path):
    client, _ = sdk
    conn = f"Endpoint=sparkbus://{ns_path};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=k="
    with ServiceBusSender._from_connection_string(conn_str=conn, queue_name="q") as sender:
        later = datetime.now(timezone.utc) + timedelta(seconds=30)
        kept, cancelled = (sender.schedule_messages(ServiceBusMessage(body), later) for body in ("kept", "cancelled"))
        sender.cancel_scheduled_messages(cancelled)
    with client.get_queue_receiver("q") as receiver:
        peeked = receiver.peek_messages(10)
        assert [m.sequence_number for m in peeked] == kept
        assert receiver.receive_messages(max_wait_time=0.5) == []  # not yet due


def test_session_pool_and_state(sdk):
    """session_send_receive / session_pool_receive: sessions taken with NEXT_AVAILABLE_SESSION until none is
    left, each drained in order with its state set, then listed (list_sessions)."""
    from sparkbus import NEXT_AVAILABLE_SESSION
    from sparkbus.exceptions import OperationTimeoutError

    client, manager = sdk
    manager.create_queue("sq", requires_session=True)
    with client.get_queue_sender(queue_name="sq") as sender:
        for session in ("s1", "s2", "s3"):
            sender.send_messages([ServiceBusMessage(f"{session}-{i}", session_id=session) for i in range(3)])
    drained = {}
    while True:
        try:
            receiver = client.get_queue_receiver(queue_name="sq", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
            with receiver:
                session = receiver.session
                session.set_state("OPEN")
                bodies = []
                for message in receiver:
                    bodies.append(str(message))
                    receiver.complete_message(message)
                session.set_state("DONE")
                drained[session.session_id] = (bodies, session.get_state())
        except OperationTimeoutError:  # what the SDK raises when no session is available
            break
    assert drained == {s: ([f"{s}-{i}" for i in range(3)], b"DONE") for s in ("s1", "s2", "s3")}
    assert sorted(client.list_queue_sessions("sq")) == ["s1", "s2", "s3"]  # they keep their state


def test_topic_rules_and_amqp_bodies(sdk, ns_path):
    """topic_subscription_with_rule_operations and send_and_receive_amqp_annotated_message: rules created
    through management decide which subscription gets what; AMQP bodies arrive as sent."""
    import os

    from sparkbus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
    from sparkbus.engine import fanout
    from sparkbus.engine.catalog import Catalog
    from sparkbus.management import CorrelationRuleFilter, SqlRuleFilter

    client, manager = sdk
    manager.create_topic("t")
    manager.create_subscription("t", "sql")
    manager.create_subscription("t", "corr")
    for name, rule in (("sql", SqlRuleFilter("color = 'red'")), ("corr", CorrelationRuleFilter(subject="blue"))):
        manager.delete_rule("t", name, "$Default")
        manager.create_rule("t", name, f"{name}-rule", filter=rule)
    with client.get_topic_sender(topic_name="t") as sender:
        sender.send_messages([AmqpAnnotatedMessage(value_body={b"n": 1}, application_properties={"color": "red"}),
                              AmqpAnnotatedMessage(sequence_body=[1, 2], properties={"subject": "blue"})])
    fanout.drain(Catalog(os.path.abspath(ns_path)), "t")
    with client.get_subscription_receiver(topic_name="t", subscription_name="sql", max_wait_time=2) as receiver:
        [red] = receiver.receive_messages(max_message_count=5)
        assert red.raw_amqp_message.body_type == AmqpMessageBodyType.VALUE and red.raw_amqp_message.body == {b"n": 1}
        assert red.application_properties.get(b"color").decode() == "red"   # the SDK's bytes keys and values
        receiver.complete_message(red)
    with client.get_subscription_receiver(topic_name="t", subscription_name="corr", max_wait_time=2) as receiver:
        [blue] = receiver.receive_messages(max_message_count=5)
        assert list(blue.raw_amqp_message.body) == [[1, 2]] and blue.subject == "blue"
        receiver.complete_message(blue)
