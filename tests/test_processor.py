"""ServiceBusProcessor on a real namespace: every message handled once by at most max_concurrent_calls
handlers at a time, a slow handler keeping its lock by renewal, a raising handler's message abandoned until
it is dead-lettered (the error handler called each time), stop() in a burst leaving nothing locked, run()
returning when idle, handlers that settle themselves, and subscriptions."""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta

import pytest

from sparkbus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from sparkbus.exceptions import InvalidOperationError, MessagingEntityNotFoundError
from sparkbus.processor import ProcessErrorContext, ProcessMessageContext


def _sent(client, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{n}") for n in range(count)])


@pytest.mark.parametrize("count, calls", [(120, 4), pytest.param(1000, 8, marks=pytest.mark.slow)])
def test_every_message_once_with_at_most_the_concurrent_calls(admin, ns_path, count, calls):
    """1,000 messages through max_concurrent_calls=8 (and 120 through 4): each handled once, never more than
    `calls` handlers at a time and more than one at some moment, every one completed."""
    admin.create_queue("jobs")
    seen, active, peak, guard = [], [0], [0], threading.Lock()

    def handle(context: ProcessMessageContext) -> None:
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)
        with guard:
            active[0] -= 1
            seen.append(str(context.message))

    with ServiceBusClient(ns_path) as client:
        _sent(client, "jobs", count)
        processor = client.get_queue_processor("jobs", handle, max_concurrent_calls=calls)
        processor.run(until_idle=timedelta(seconds=2))
    assert sorted(seen) == sorted(f"m{n}" for n in range(count))  # each once
    assert 1 < peak[0] <= calls
    assert (processor.counts.received, processor.counts.completed, processor.counts.failed) == (count, count, 0)
    assert admin.get_queue_runtime_properties("jobs").total_message_count == 0


@pytest.mark.slow
def test_a_handler_slower_than_the_lock_keeps_it_by_renewal(admin, ns_path):
    admin.create_queue("slow", lock_duration=timedelta(seconds=5))
    deliveries = []

    def handle(context: ProcessMessageContext) -> None:
        deliveries.append(context.message.delivery_count)
        time.sleep(8)  # past the 5-second lock

    with ServiceBusClient(ns_path) as client:
        _sent(client, "slow", 1)
        with client.get_queue_processor("slow", handle, max_concurrent_calls=2) as processor:
            processor.run(until_idle=timedelta(seconds=1))
    assert deliveries == [1] and processor.counts.completed == 1 and processor.counts.lock_renewal_failures == 0
    assert processor.counts.lock_renewals >= 1
    recorded = admin.get_entity_metrics("slow")
    assert recorded.lock_renewals == processor.counts.lock_renewals and recorded.processed_messages == 1
    assert admin.get_queue_runtime_properties("slow").total_message_count == 0


def test_a_raising_handler_abandons_until_the_message_is_dead_lettered(admin, ns_path):
    admin.create_queue("poison", max_delivery_count=3)
    errors: list[ProcessErrorContext] = []

    def handle(context: ProcessMessageContext) -> None:
        raise RuntimeError(f"cannot handle {context.message}")

    with ServiceBusClient(ns_path) as client:
        _sent(client, "poison", 1)
        processor = client.get_queue_processor("poison", handle, process_error=errors.append)
        processor.run(until_idle=timedelta(seconds=1.5))
        with client.get_queue_receiver("poison", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead:
            [message] = dead.peek_messages(5)
    assert [(e.error_source, str(e.error), str(e.message)) for e in errors] == \
        [("process_message", "cannot handle m0", "m0")] * 3
    assert message.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert (processor.counts.failed, processor.counts.abandoned) == (3, 3)
    recorded = admin.get_entity_metrics("poison")
    assert (recorded.processed_messages, recorded.failed_messages, recorded.abandoned_messages,
            recorded.dead_lettered_messages) == (3, 3, 3, 0)  # in the namespace's metrics


@pytest.mark.parametrize("prefetch", [0, 10])
def test_stop_in_a_burst_leaves_each_message_settled_once_or_available(admin, ns_path, prefetch):
    """stop() during a burst: every message handled once or available again at once (prefetched ones
    given back, never delivered: delivery count 0 before this receive)."""
    admin.create_queue("burst")
    handled, started = [], threading.Event()

    def handle(context: ProcessMessageContext) -> None:
        started.set()
        time.sleep(0.1)
        handled.append(str(context.message))

    with ServiceBusClient(ns_path) as client:
        _sent(client, "burst", 60)
        processor = client.get_queue_processor("burst", handle, max_concurrent_calls=3, prefetch_count=prefetch)
        processor.start()
        assert started.wait(30)
        time.sleep(0.3)
        processor.stop()
        assert not processor.is_running
        with client.get_queue_receiver("burst") as receiver:  # nothing left locked: the rest receivable now
            rest = receiver.receive_messages(60, max_wait_time=5)
            while len(rest) < 60 - len(handled):
                more = receiver.receive_messages(60, max_wait_time=2)
                if not more:
                    break
                rest += more
    assert 0 < len(handled) < 60 and len(set(handled)) == len(handled)
    assert sorted(handled + [str(m) for m in rest]) == sorted(f"m{n}" for n in range(60))
    assert processor.counts.completed == len(handled) and {m.delivery_count for m in rest} == {1}


def test_handlers_that_settle_themselves_are_not_completed_again(admin, ns_path):
    admin.create_queue("mixed")

    def handle(context: ProcessMessageContext) -> None:
        body = str(context.message)
        if body == "m0":
            context.dead_letter(reason="checked", error_description="by the handler")
        elif body == "m1":
            context.defer()
        # m2: completed by the processor

    with ServiceBusClient(ns_path) as client:
        _sent(client, "mixed", 3)
        processor = client.get_queue_processor("mixed", handle)
        processor.run(until_idle=timedelta(seconds=1))
    counts = processor.counts
    assert (counts.dead_lettered, counts.deferred, counts.completed, counts.errors) == (1, 1, 1, 0)
    runtime = admin.get_queue_runtime_properties("mixed")
    assert (runtime.dead_letter_message_count, runtime.deferred_message_count, runtime.active_message_count) == (1, 1, 1)


def test_a_processor_of_no_such_queue_reports_it_and_bad_options_are_refused(admin, ns_path):
    errors: list[ProcessErrorContext] = []
    with ServiceBusClient(ns_path) as client:
        processor = client.get_queue_processor("missing", lambda context: None, process_error=errors.append)
        processor.run(until_idle=timedelta(seconds=0.5))
        assert errors and errors[0].error_source == "receive"
        assert isinstance(errors[0].error, MessagingEntityNotFoundError) and "'missing'" in str(errors[0].error)
        with pytest.raises(ValueError, match="max_concurrent_calls must be an int of at least 1"):
            client.get_queue_processor("missing", lambda context: None, max_concurrent_calls=0)
        with pytest.raises(TypeError, match="process_message must be callable"):
            client.get_queue_processor("missing", "not a function")


def test_the_async_processor_runs_coroutine_handlers_concurrently(admin, ns_path):
    import asyncio

    from sparkbus.aio import ServiceBusClient as AsyncClient

    admin.create_queue("jobs")
    with ServiceBusClient(ns_path) as client:
        _sent(client, "jobs", 40)
    seen, active, peak = [], [0], [0]

    async def handle(context) -> None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await asyncio.sleep(0.05)
        active[0] -= 1
        seen.append(str(context.message))

    async def main():
        async with AsyncClient(ns_path) as client:
            processor = client.get_queue_processor("jobs", handle, max_concurrent_calls=4)
            await processor.run(until_idle=timedelta(seconds=2))
            return processor

    processor = asyncio.run(main())
    assert sorted(seen) == sorted(f"m{n}" for n in range(40)) and 1 < peak[0] <= 4
    assert processor.counts.completed == 40
    assert admin.get_queue_runtime_properties("jobs").total_message_count == 0


def test_a_cancelled_async_processor_leaves_nothing_locked(admin, ns_path):
    import asyncio

    from sparkbus.aio import ServiceBusClient as AsyncClient

    admin.create_queue("jobs")
    with ServiceBusClient(ns_path) as client:
        _sent(client, "jobs", 5)
    started = []

    async def handle(context) -> None:
        started.append(str(context.message))
        await asyncio.sleep(60)  # cancelled long before

    async def main():
        async with AsyncClient(ns_path) as client:
            processor = client.get_queue_processor("jobs", handle, max_concurrent_calls=2)
            running = asyncio.create_task(processor.run())
            while len(started) < 2:
                await asyncio.sleep(0.05)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running

    asyncio.run(main())
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("jobs") as receiver:
        got = receiver.receive_messages(5, max_wait_time=5)
        while len(got) < 5:
            more = receiver.receive_messages(5, max_wait_time=2)
            if not more:
                break
            got += more
    assert sorted(str(m) for m in got) == [f"m{n}" for n in range(5)]  # the cancelled handlers' ones too, at once


@pytest.mark.parametrize("sessions", [False, True], ids=["messages", "sessions"])
def test_sparkbus_process_runs_a_handler_until_sigterm_stops_it_gracefully(admin, ns_path, tmp_path, sessions):
    """`sparkbus process` (with --sessions: a session processor, each session's messages in order) handles
    every message, and SIGTERM stops it gracefully with its counts printed."""
    import signal
    import subprocess
    import sys

    admin.create_queue("jobs", requires_session=sessions)
    (tmp_path / "work.py").write_text(  # handlers run on two threads: a line each, whole
        "import threading, time\n"
        "printing = threading.Lock()\n"
        "def handle(context):\n"
        "    time.sleep(0.05)\n"
        "    with printing:\n"
        "        print('handled', context.message, flush=True)\n")
    with ServiceBusClient(ns_path) as client:
        if sessions:
            _session_messages(client, "jobs", 2, 5)
        else:
            _sent(client, "jobs", 10)
    command = [sys.executable, "-m", "sparkbus.cli", "process", "--namespace", ns_path, "--entity", "jobs",
               "--handler", "work:handle", "--concurrency", "1" if sessions else "2"]
    worker = subprocess.Popen(command + (["--sessions", "2"] if sessions else []), cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)
    printed: queue.Queue[str] = queue.Queue()  # read on a thread, so a worker that stops printing fails the test
    reader = threading.Thread(target=lambda: [printed.put(line) for line in worker.stdout], daemon=True)
    reader.start()
    lines = []
    try:
        while sum(line.startswith("handled") for line in lines) < 10:
            try:
                lines.append(printed.get(timeout=120))
            except queue.Empty:
                raise AssertionError(f"the worker printed nothing more in 120 s: {lines}") from None
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        reader.join(timeout=60)
        out = "".join(printed.get() for _ in range(printed.qsize()))
    finally:
        worker.kill()
    assert worker.returncode == 0
    handled = [line.split()[1] for line in lines if line.startswith("handled")]
    if sessions:
        assert lines[0].startswith("processing jobs with work:handle (2 sessions at a time, 1 call(s) in each")
        assert [m for m in handled if m.startswith("s0")] == [f"s0-{n}" for n in range(5)]  # in order
        assert sorted(handled) == sorted(f"s{s}-{n}" for s in range(2) for n in range(5))
    else:
        assert lines[0].startswith("processing jobs with work:handle (2 at a time")
        assert sorted(handled) == sorted(f"m{n}" for n in range(10))
    assert "stopped: 10 received, 10 completed, 0 failed" in out
    assert admin.get_queue_runtime_properties("jobs").total_message_count == 0


def _session_messages(client, queue: str, sessions: int, each: int) -> None:
    """each messages in each of `sessions` sessions, interleaved: s0-0, s1-0, ..., s0-1, ..."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"s{s}-{n}", session_id=f"s{s}")
                              for n in range(each) for s in range(sessions)])


def test_a_session_processor_keeps_each_sessions_order_with_sessions_in_parallel(admin, ns_path):
    """Four sessions of 15 messages through max_concurrent_sessions=2: every message once, each session's in
    order, two sessions handled at the same moment (never more), and the session state a handler keeps
    (a count per session) readable from the context."""
    admin.create_queue("orders", requires_session=True)
    seen: dict[str, list[int]] = {}
    active: set[str] = set()
    peak, guard = [0], threading.Lock()

    def handle(context: ProcessMessageContext) -> None:
        session, number = str(context.message).split("-")
        with guard:
            active.add(context.session_id)
            peak[0] = max(peak[0], len(active))
        time.sleep(0.02)
        state = int(context.get_session_state() or b"0")
        context.set_session_state(str(state + 1))
        context.renew_lock()  # the session's lock
        with guard:
            seen.setdefault(session, []).append(int(number))
            active.discard(context.session_id)

    with ServiceBusClient(ns_path) as client:
        _session_messages(client, "orders", 4, 15)
        processor = client.get_queue_session_processor("orders", handle, max_concurrent_sessions=2,
                                                       session_idle_timeout=timedelta(seconds=0.5))
        processor.run(until_idle=timedelta(seconds=3))
        states = {}
        for s in range(4):
            with client.get_queue_receiver("orders", session_id=f"s{s}") as receiver:
                states[f"s{s}"] = receiver.session.get_state()
    assert seen == {f"s{s}": list(range(15)) for s in range(4)}
    assert peak[0] == 2
    assert states == {f"s{s}": b"15" for s in range(4)}
    counts = processor.counts
    assert (counts.received, counts.completed, counts.failed) == (60, 60, 0) and counts.sessions_accepted >= 4
    assert admin.get_queue_runtime_properties("orders").total_message_count == 0


def test_a_session_processor_takes_only_the_named_sessions_and_releases_on_request(admin, ns_path):
    """session_ids=['s1', 's3'] leaves s0 and s2 alone; a handler's release_session() lets its session go
    after that message (the session is taken again for the rest); calls per session above 1 still settle
    every message once."""
    admin.create_queue("orders", requires_session=True)
    seen, guard = [], threading.Lock()

    def handle(context: ProcessMessageContext) -> None:
        with guard:
            seen.append(str(context.message))
        context.release_session()

    with ServiceBusClient(ns_path) as client:
        _session_messages(client, "orders", 4, 3)
        processor = client.get_queue_session_processor("orders", handle, session_ids=["s1", "s3"],
                                                       max_concurrent_calls_per_session=2)
        processor.run(until_idle=timedelta(seconds=3))
        left = {}
        for s in range(4):
            with client.get_queue_receiver("orders", session_id=f"s{s}") as receiver:
                left[f"s{s}"] = [str(m) for m in receiver.peek_messages(10)]
    assert sorted(seen) == sorted(f"s{s}-{n}" for s in (1, 3) for n in range(3))
    assert left == {"s0": ["s0-0", "s0-1", "s0-2"], "s1": [], "s2": ["s2-0", "s2-1", "s2-2"], "s3": []}
    assert processor.counts.sessions_accepted >= 3  # released after the first call: s1 or s3 taken twice or more


def test_session_processor_options_are_checked(admin, ns_path):
    admin.create_queue("orders", requires_session=True)
    admin.create_queue("jobs")
    with ServiceBusClient(ns_path) as client:
        for bad, error, words in (({"max_concurrent_sessions": 0}, ValueError, "max_concurrent_sessions"),
                                  ({"max_concurrent_calls_per_session": True}, ValueError, "per_session"),
                                  ({"session_ids": "s1"}, TypeError, "list of session ids"),
                                  ({"session_ids": []}, ValueError, "at least one session"),
                                  ({"session_idle_timeout": 0}, ValueError, "positive"),
                                  ({"prefetch_count": -1}, ValueError, "prefetch_count")):
            with pytest.raises(error, match=words):
                client.get_queue_session_processor("orders", lambda context: None, **bad)
        with client.get_queue_receiver("jobs") as receiver:
            context = ProcessMessageContext(None, receiver, "jobs")  # type: ignore[arg-type]
            for use in (context.get_session_state, context.release_session):
                with pytest.raises(InvalidOperationError, match="not processed by sessions"):
                    use()


def test_the_async_session_processor_keeps_order_and_state_across_sessions_in_parallel(admin, ns_path):
    """The async session processor: three sessions of 10 through max_concurrent_sessions=3 tasks, each
    session's messages in order, sessions overlapping, the state kept through the context's coroutines."""
    import asyncio

    from sparkbus.aio import ServiceBusClient as AsyncClient

    admin.create_queue("orders", requires_session=True)
    with ServiceBusClient(ns_path) as client:
        _session_messages(client, "orders", 3, 10)
    seen: dict[str, list[int]] = {}
    active: set[str] = set()
    peak = [0]

    async def handle(context) -> None:
        session, number = str(context.message).split("-")
        active.add(session)
        peak[0] = max(peak[0], len(active))
        await asyncio.sleep(0.02)
        state = int(await context.get_session_state() or b"0")
        await context.set_session_state(str(state + 1))
        seen.setdefault(session, []).append(int(number))
        active.discard(session)

    async def main():
        async with AsyncClient(ns_path) as client:
            processor = client.get_queue_session_processor("orders", handle, max_concurrent_sessions=3,
                                                           session_idle_timeout=0.5)
            await processor.run(until_idle=timedelta(seconds=3))
            states = []
            for s in range(3):
                async with client.get_queue_receiver("orders", session_id=f"s{s}") as receiver:
                    states.append(await receiver.session.get_state())
            return processor, states

    processor, states = asyncio.run(main())
    assert seen == {f"s{s}": list(range(10)) for s in range(3)} and peak[0] > 1
    assert states == [b"10"] * 3 and processor.counts.completed == 30
    assert admin.get_queue_runtime_properties("orders").total_message_count == 0


def test_subscription_processors_get_what_the_fan_out_gave_each_subscription(admin, ns_path):
    """A topic with a filtered subscription and an unfiltered one, fanned out: a sync processor of the
    first and an async one of the second each handle exactly their subscription's copies, once."""
    import asyncio

    from sparkbus import SqlRuleFilter
    from sparkbus.aio import ServiceBusClient as AsyncClient
    from sparkbus.engine import fanout
    from sparkbus.engine.namespace import open_catalog

    admin.create_topic("events")
    admin.create_subscription("events", "eu")
    admin.delete_rule("events", "eu", "$Default")
    admin.create_rule("events", "eu", "region", filter=SqlRuleFilter("region = 'eu'"))
    admin.create_subscription("events", "all")
    with ServiceBusClient(ns_path) as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages([ServiceBusMessage(f"e{n}", application_properties={"region": "eu" if n % 2 else "us"})
                                  for n in range(30)])
        fanout.drain(open_catalog(ns_path), "events")
        eu, everything = [], []
        with client.get_subscription_processor("events", "eu", lambda c: eu.append(str(c.message)),
                                               max_concurrent_calls=3) as processor:
            processor.run(until_idle=timedelta(seconds=1.5))

    async def handle(context) -> None:
        everything.append(str(context.message))

    async def main():
        async with AsyncClient(ns_path) as client:
            await client.get_subscription_processor("events", "all", handle, max_concurrent_calls=3).run(until_idle=1.5)

    asyncio.run(main())
    assert sorted(eu) == sorted(f"e{n}" for n in range(1, 30, 2))
    assert sorted(everything) == sorted(f"e{n}" for n in range(30))
    for name in ("eu", "all"):
        assert admin.get_subscription_runtime_properties("events", name).total_message_count == 0


def test_a_receive_and_delete_processor_handles_each_message_once_with_nothing_to_settle(admin, ns_path):
    from sparkbus import ServiceBusReceiveMode

    admin.create_queue("jobs")
    seen, settled = [], []

    def handle(context: ProcessMessageContext) -> None:
        seen.append(str(context.message))
        settled.append(context.settled_as)

    with ServiceBusClient(ns_path) as client:
        _sent(client, "jobs", 30)
        processor = client.get_queue_processor("jobs", handle, max_concurrent_calls=2,
                                               receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
        processor.run(until_idle=timedelta(seconds=1))
    assert sorted(seen) == sorted(f"m{n}" for n in range(30)) and set(settled) == {"deleted"}
    assert processor.counts.completed == 0 and admin.get_queue_runtime_properties("jobs").total_message_count == 0
