"""A client that the crash harness (tests/test_crash.py) kills with SIGKILL at a random moment.

    python tests/crash_worker.py <namespace> <log file> <seed>

It runs a seeded random sequence of operations on the harness's namespace forever: sends (single,
batches, scheduled and cancelled), receives with complete, complete_messages, abandon, defer and
receive_deferred, dead-letter, session state, topic fan-out, forwarding, management, maintenance sweeps
(which move what left q to its archive), the async API
(sends, receives with complete, and receives cancelled while they run), and a processor (two handlers at
once, some with prefetch, completing or abandoning each message) run until the queue is idle. Before each
operation it logs what it starts; after the call returns, what was acknowledged. Every line is fsynced
before the next call, so the log never claims more than what the namespace acknowledged, and never
misses an acknowledgement the caller could have acted on.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from datetime import datetime, timedelta, timezone

import sparkbus
from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from sparkbus import aio
from sparkbus.engine import fanout, forwarding, housekeeping
from sparkbus.engine.namespace import open_catalog

OPERATIONS = ("send", "send_batch", "schedule", "receive_complete", "complete_batch", "abandon", "defer",
              "dead_letter", "session", "topic", "forward", "management", "async", "processor", "maintain")


class Log:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **record: object) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())
        os.fsync(self._fd)


def received(messages: list) -> list:
    return [[m.message_id, m.delivery_count, m.sequence_number] for m in messages]


def main(namespace: str, log_path: str, seed: int) -> None:
    rng = random.Random(seed)
    log = Log(log_path)
    client = ServiceBusClient(namespace, retry_total=10)
    admin = sparkbus.ServiceBusAdministrationClient(namespace)
    catalog = open_catalog(namespace)
    q_sender, t_sender, src_sender = (client.get_queue_sender("q"), client.get_topic_sender("t"),
                                      client.get_queue_sender("src"))
    sq_sender = client.get_queue_sender("sq")
    receiver = client.get_queue_receiver("q", max_wait_time=0.5)
    loop = asyncio.new_event_loop()  # one loop for the async client and everything it made
    async_client = aio.ServiceBusClient(namespace, retry_total=10)
    async_sender, async_receiver = async_client.get_queue_sender("q"), async_client.get_queue_receiver("q")
    counter = 0

    def ids(count: int) -> list[str]:
        nonlocal counter
        counter += count
        return [f"{seed}-{counter - count + i}" for i in range(count)]

    log.write(ready=True)
    while True:
        op = rng.choice(OPERATIONS)
        if op in ("send", "send_batch"):
            batch = ids(1 if op == "send" else rng.randint(2, 40))
            log.write(start=op, entity="q", ids=batch)
            q_sender.send_messages([ServiceBusMessage(f"body {i}", message_id=i) for i in batch])
            log.write(ack="sent", entity="q", ids=batch)
        elif op == "schedule":
            batch = ids(rng.randint(1, 5))
            log.write(start=op, entity="q", ids=batch)
            when = datetime.now(timezone.utc) + timedelta(seconds=rng.choice([1, 3600]))
            numbers = q_sender.schedule_messages([ServiceBusMessage("s", message_id=i) for i in batch], when)
            log.write(ack="sent", entity="q", ids=batch)
            if rng.random() < 0.5:
                log.write(start="cancel", entity="q", ids=batch)
                q_sender.cancel_scheduled_messages(numbers)
                log.write(ack="cancelled", entity="q", ids=batch)
        elif op in ("receive_complete", "complete_batch", "abandon", "defer", "dead_letter"):
            log.write(start="receive", entity="q")
            got = receiver.receive_messages(rng.randint(1, 10))
            log.write(ack="received", entity="q", msgs=received(got))
            if not got:
                continue
            names = [m.message_id for m in got]
            log.write(start=op, entity="q", ids=names)
            if op == "receive_complete":
                for m in got:
                    receiver.complete_message(m)
                log.write(ack="completed", entity="q", ids=names)
            elif op == "complete_batch":
                receiver.complete_messages(got)
                log.write(ack="completed", entity="q", ids=names)
            elif op == "abandon":
                for m in got:
                    receiver.abandon_message(m)
                log.write(ack="abandoned", entity="q", ids=names)
            elif op == "dead_letter":
                for m in got:
                    receiver.dead_letter_message(m, reason="crash-test")
                log.write(ack="dead_lettered", entity="q", ids=names)
            else:
                for m in got:
                    receiver.defer_message(m)
                log.write(ack="deferred", entity="q", ids=names)
                log.write(start="receive_deferred", entity="q", ids=names)
                again = receiver.receive_deferred_messages([m.sequence_number for m in got])
                log.write(ack="received", entity="q", msgs=received(again))
                log.write(start="complete_deferred", entity="q", ids=names)
                receiver.complete_messages(again)
                log.write(ack="completed", entity="q", ids=names)
        elif op == "processor":
            def handle(context) -> None:
                message = context.message
                log.write(ack="received", entity="q", msgs=received([message]))
                settle = "abandon" if rng.random() < 0.2 else "complete"
                log.write(start=f"processor_{settle}", entity="q", ids=[message.message_id])
                getattr(context, settle)()
                log.write(ack="abandoned" if settle == "abandon" else "completed", entity="q", ids=[message.message_id])

            processor = client.get_queue_processor("q", handle, max_concurrent_calls=2,
                                                   prefetch_count=rng.choice([0, 5]))
            processor.run(until_idle=0.3)
        elif op == "session":
            session = f"s{rng.randint(0, 3)}"
            batch = ids(rng.randint(1, 5))
            log.write(start="send", entity="sq", ids=batch)
            sq_sender.send_messages([ServiceBusMessage("x", message_id=i, session_id=session) for i in batch])
            log.write(ack="sent", entity="sq", ids=batch)
            try:
                with client.get_queue_receiver("sq", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.5) as r:
                    value = f"{seed}-{counter}"
                    log.write(start="state", session=r.session.session_id, value=value)
                    r.session.set_state(value.encode())
                    log.write(ack="state", session=r.session.session_id, value=value)
                    got = r.receive_messages(5)
                    log.write(ack="received", entity="sq", msgs=received(got))
                    log.write(start="complete", entity="sq", ids=[m.message_id for m in got])
                    r.complete_messages(got)
                    log.write(ack="completed", entity="sq", ids=[m.message_id for m in got])
            except sparkbus.OperationTimeoutError:
                pass  # every session is held by a receiver killed earlier: their locks lapse later
        elif op == "topic":
            batch = ids(rng.randint(1, 20))
            log.write(start="send", entity="t", ids=batch)
            t_sender.send_messages([ServiceBusMessage("t", message_id=i, application_properties={"n": k})
                                    for k, i in enumerate(batch)])
            log.write(ack="sent", entity="t", ids=batch)
            log.write(start="fanout")
            fanout.drain(catalog, "t")
            log.write(ack="fanout")
        elif op == "forward":
            batch = ids(rng.randint(1, 20))
            log.write(start="send", entity="src", ids=batch)
            src_sender.send_messages([ServiceBusMessage("f", message_id=i) for i in batch])
            log.write(ack="sent", entity="src", ids=batch)
            log.write(start="forward")
            forwarding.forward_all(catalog)
            log.write(ack="forward")
        elif op == "maintain":  # the namespace service's sweep: q keeps an archive, so what left it moves there
            log.write(start="maintain")
            housekeeping.sweep(catalog)
            log.write(ack="maintain")
        elif op == "async":
            batch = ids(rng.randint(1, 20))
            log.write(start="send", entity="q", ids=batch)
            loop.run_until_complete(async_sender.send_messages([ServiceBusMessage("a", message_id=i) for i in batch]))
            log.write(ack="sent", entity="q", ids=batch)
            log.write(start="receive", entity="q")
            got = loop.run_until_complete(async_receiver.receive_messages(rng.randint(1, 10), max_wait_time=0.5))
            log.write(ack="received", entity="q", msgs=received(got))
            if got:
                log.write(start="receive_complete", entity="q", ids=[m.message_id for m in got])
                loop.run_until_complete(async_receiver.complete_messages(got))
                log.write(ack="completed", entity="q", ids=[m.message_id for m in got])
            log.write(start="receive", entity="q")  # cancelled while it runs: what it took goes back
            got = loop.run_until_complete(cancelled_receive(async_receiver, rng.random() * 0.05))
            log.write(ack="received", entity="q", msgs=received(got))  # [] unless it ended before the cancel
        else:
            name = f"m{seed}x{counter}"
            counter += 1
            log.write(start="create", entity=name)
            admin.create_queue(name, enable_partitioning=rng.random() < 0.5)
            log.write(ack="created", entity=name)
            if rng.random() < 0.5:
                log.write(start="delete", entity=name)
                admin.delete_queue(name)
                log.write(ack="deleted", entity=name)
        if rng.random() < 0.05:  # the dead-letter sub-queue is received from too
            with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=0.2) as dlq:
                log.write(start="receive_dead_letter", entity="q")
                got = dlq.receive_messages(5)
                log.write(ack="received_dead_letter", entity="q", msgs=received(got))


async def cancelled_receive(receiver: aio.ServiceBusReceiver, after: float) -> list:
    """A receive of up to 10 messages cancelled `after` seconds in; what it returned if it ended first."""
    task = asyncio.ensure_future(receiver.receive_messages(10, max_wait_time=0.5))
    await asyncio.sleep(after)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return []


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
