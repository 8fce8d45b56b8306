"""Receivers wait as the SDK's do: without max_wait_time, receive_messages() and iterating a receiver block
until a message arrives (sent by another process), the receiver is closed from another thread, or the
process is interrupted; waiting reads storage at a backed-off rate and costs almost no CPU; max_wait_time=0
returns at once."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

from sparkbus import ServiceBusMessage

from conftest import idle_receivers, wait_until

SEND_LATER = textwrap.dedent("""
    import sys, time
    from sparkbus import ServiceBusClient, ServiceBusMessage
    path, queue, delay, *bodies = sys.argv[1:]
    with ServiceBusClient(path) as client, client.get_queue_sender(queue) as sender:
        for body in bodies:
            time.sleep(float(delay))
            sender.send_messages(ServiceBusMessage(body))
""")


def _send_later(ns_path: str, queue: str, delay: float, *bodies: str) -> subprocess.Popen:
    """Another process that sends each body after `delay` seconds (the first after its start-up)."""
    return subprocess.Popen([sys.executable, "-c", SEND_LATER, ns_path, queue, str(delay), *bodies])


def test_receive_without_max_wait_time_waits_for_a_message_sent_later(admin, client, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    with client.get_queue_receiver("q") as receiver:
        assert receiver.receive_messages(max_wait_time=0) == []  # returns at once on an empty queue
        sender = _send_later(ns_path, "q", 2.0, "late")
        started = time.monotonic()
        got = receiver.receive_messages(max_message_count=10)
        waited = time.monotonic() - started
        assert sender.wait(timeout=60) == 0
        assert [str(m) for m in got] == ["late"]
        assert waited >= 2.0  # it waited for the message instead of returning the empty queue's []
        receiver.complete_message(got[0])


def test_iterating_without_max_wait_time_goes_on_past_an_empty_queue_until_closed(admin, client, ns_path):
    admin.create_queue("q")
    receiver = client.get_queue_receiver("q")
    sender = _send_later(ns_path, "q", 1.5, "a", "b", "c")  # the queue is empty between the messages
    seen: list[str] = []

    def work() -> None:
        for message in receiver:
            seen.append(str(message))
            receiver.complete_message(message)
    worker = threading.Thread(target=work)
    worker.start()
    assert sender.wait(timeout=60) == 0
    wait_until(lambda: len(seen) >= 3, 30)
    assert worker.is_alive()  # still waiting for a fourth message
    receiver.close()  # from another thread: the waiting iteration ends
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert seen == ["a", "b", "c"]


def test_close_from_another_thread_ends_a_waiting_receive(admin, client):
    admin.create_queue("q")
    receiver = client.get_queue_receiver("q")
    results: list[list] = []
    waiting = threading.Thread(target=lambda: results.append(receiver.receive_messages()))
    waiting.start()
    time.sleep(1.0)
    assert waiting.is_alive() and results == []
    receiver.close()
    waiting.join(timeout=10)
    assert not waiting.is_alive() and results == [[]]


def test_a_receiver_max_wait_time_still_bounds_the_wait(admin, client):
    admin.create_queue("q")
    with client.get_queue_receiver("q", max_wait_time=0.5) as receiver:
        started = time.monotonic()
        assert receiver.receive_messages() == []
        assert list(receiver) == []
        assert time.monotonic() - started >= 1.0  # both waited their half second
        client.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
        assert [str(m) for m in receiver] == ["x"]


IDLE = textwrap.dedent("""
    import sys, threading, time
    from sparkbus import ServiceBusClient
    path, seconds = sys.argv[1], float(sys.argv[2])
    with ServiceBusClient(path) as client:
        queue = client.get_queue_receiver("q")
        topic = client.get_subscription_receiver("t", "s")
        for receiver in (queue, topic):
            threading.Thread(target=receiver.receive_messages, daemon=True).start()
        time.sleep(1.0)  # both are waiting
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(seconds)
        print(time.process_time() - cpu, time.monotonic() - wall)
        queue.close(); topic.close()
""")


def test_waiting_costs_almost_no_cpu(admin, ns_path):
    """Two receivers (a partitioned queue's and a subscription's) waiting in one process for several idle
    seconds use a small fraction of one core (a loop that kept reading storage would use most of it)."""
    cpu, wall = idle_receivers(ns_path, IDLE, 4)
    assert wall >= 4.0
    # 3-4% of a core on a quiet machine; 5.3% was seen while the other test worker started a JVM
    assert cpu / wall < 0.10, f"waiting used {cpu:.3f} s of CPU in {wall:.1f} s"


INTERRUPTED = textwrap.dedent("""
    import sys
    from sparkbus import ServiceBusClient
    with ServiceBusClient(sys.argv[1]) as client, client.get_queue_receiver("q") as receiver:
        print("waiting", flush=True)
        receiver.receive_messages()
""")


def test_an_interrupt_ends_a_waiting_receive(admin, ns_path):
    admin.create_queue("q")
    waiting = subprocess.Popen([sys.executable, "-c", INTERRUPTED, ns_path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert waiting.stdout.readline() == "waiting\n"
    time.sleep(0.5)
    assert waiting.poll() is None  # still waiting
    waiting.send_signal(signal.SIGINT)
    _, errors = waiting.communicate(timeout=30)
    assert waiting.returncode != 0 and "KeyboardInterrupt" in errors
