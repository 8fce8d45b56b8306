"""Credit-based throttling, the premium governor, retries of throttled requests and the request metrics,
on real namespaces (the ledger file shared by spawned processes, Delta tables for the metrics)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, ServiceBusServerBusyError
from sparkbus.core import throttling
from sparkbus.core.throttling import Bucket, replenished
from sparkbus.engine import fanout
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.retry import NO_RETRY
from sparkbus.engine.throttle import Slots, Usage

from conftest import run_spawned, stored_messages

TEXT = ("The request was terminated because the entity is being throttled. Error code: 50009. "
        "Please wait 2 seconds and try again.")


# ---- the rules (pure) -----------------------------------------------------------------------------------

def test_the_error_text_is_the_services():
    assert throttling.THROTTLED_TEXT == TEXT


def test_a_bucket_is_replenished_each_period_up_to_a_full_one():
    assert replenished(Bucket(10, 300), 11, 1000) == Bucket(11, 1000)  # never above a full bucket
    assert replenished(Bucket(10, -3500), 12, 1000) == Bucket(12, -1500)
    assert replenished(Bucket(10, 20), 10, 1000) == Bucket(10, 20)
    assert replenished(Bucket(10, 20), 9, 1000) == Bucket(10, 20)  # a clock stepped back changes nothing


def test_bulk_work_is_admitted_then_repaid_over_the_following_periods():
    bucket = Bucket(0, 1000)
    assert throttling.admits(bucket)
    bucket = throttling.charged(bucket, 5000)  # one 5,000-message DataFrame: admitted, balance -4,000
    assert bucket.balance == -4000
    waits = [p for p in range(1, 10) if not throttling.admits(replenished(bucket, p, 1000))]
    assert waits == [1, 2, 3, 4]  # about five seconds later the namespace is admitted again
    assert not throttling.admits(Bucket(0, 0))  # admitted only while the balance is positive
    assert [throttling.periods_until_admitted(Bucket(0, b), 1000) for b in (1, 0, -1, -4000, -4500)] == [0, 1, 1, 5, 5]


def test_costs_and_budgets_follow_the_seeds():
    assert (throttling.data_cost(7), throttling.MANAGEMENT_COST, throttling.filter_cost(10, 3)) == (7, 10, 30)
    assert throttling.budget("standard", 1000, 1) == throttling.Budget(1000, None)
    assert throttling.budget("basic", None, 1) == throttling.Budget(None, None)
    one, two = throttling.budget("premium", None, 1), throttling.budget("premium", None, 2)
    assert one.credits_per_second > 1000  # 1 MU is faster than a standard namespace
    assert (two.credits_per_second, two.concurrency) == (2 * one.credits_per_second, 2 * one.concurrency)


def test_machines_share_a_budget_rounded_up_and_never_to_zero():
    share = throttling.share
    assert share(throttling.Budget(1000, None), 3) == throttling.Budget(334, None)
    assert share(throttling.Budget(4000, 32), 2) == throttling.Budget(2000, 16)
    assert share(throttling.Budget(1, 1), 5) == throttling.Budget(1, 1)
    assert share(throttling.Budget(None, None), 4) == throttling.Budget(None, None)
    with pytest.raises(ValueError, match="at least 1 machine"):
        share(throttling.Budget(1000, None), 0)


# ---- admission on a real namespace ---------------------------------------------------------------------

def _filled(ns_path: str, count: int, credits: int = 1000) -> None:
    """A queue 'q' holding count small messages, sent unthrottled; then the namespace gets its budget."""
    sparkbus.create_namespace(ns_path, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q")
    with ServiceBusClient(ns_path).get_queue_sender("q") as sender:
        for start in range(0, count, 1000):
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                  for i in range(start, min(start + 1000, count))])
    admin.update_namespace(credits_per_second=credits)


def _in_debt(ns_path: str, peeked: int) -> None:
    """Spend `peeked` credits in one admitted request (a peek is charged per message it returns)."""
    with ServiceBusClient(ns_path).get_queue_receiver("q") as receiver:
        assert len(receiver.peek_messages(peeked, sequence_number=1)) == peeked


def test_out_of_credits_with_retry_total_0_raises_50009_and_does_nothing(ns_path, clock):
    _filled(ns_path, 4000)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path, retry_total=0)
    before = stored_messages(admin, "q").num_rows
    _in_debt(ns_path, 4000)  # balance about -3,000: three seconds of credits owed
    client = ServiceBusClient(ns_path, retry_total=0)
    with pytest.raises(ServiceBusServerBusyError) as sent:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("late", message_id="late"))
    assert str(sent.value) == TEXT
    receiver = client.get_queue_receiver("q")
    with pytest.raises(ServiceBusServerBusyError, match="Error code: 50009"):
        receiver.receive_messages(max_message_count=5)
    with pytest.raises(ServiceBusServerBusyError, match="Error code: 50009"):
        admin.get_queue("q")  # management is throttled too
    clock.advance(4.5)  # the debt is repaid
    runtime = admin.get_queue_runtime_properties("q")
    assert runtime.active_message_count == before == 4000  # nothing written, nothing locked
    assert stored_messages(admin, "q").num_rows == before
    peeked = ServiceBusClient(ns_path).get_queue_receiver("q").peek_messages(4000, sequence_number=1)
    assert all(m.delivery_count == 0 for m in peeked)  # nothing locked or delivered
    usage = admin.get_namespace_metrics()
    assert usage.throttled_requests >= 3


def test_a_send_timeout_ends_the_wait_for_credits_and_writes_nothing(ns_path):
    """timeout= bounds the retries of a throttled send: with seconds of credits owed, a 0.3 s timeout gives
    OperationTimeoutError (nothing stored), the same send without one waits and succeeds."""
    _filled(ns_path, 3000)
    _in_debt(ns_path, 3000)  # about two seconds of credits owed
    sender = ServiceBusClient(ns_path, retry_total=10).get_queue_sender("q")
    with pytest.raises(sparkbus.OperationTimeoutError, match="within its timeout"):
        sender.send_messages(ServiceBusMessage("late", message_id="late"), timeout=0.3)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path, retry_total=10)
    assert "late" not in stored_messages(admin, "q")["message_id"].to_pylist()
    sender.send_messages(ServiceBusMessage("late", message_id="late"))
    assert stored_messages(admin, "q")["message_id"].to_pylist().count("late") == 1


def test_a_throttled_receive_keeps_the_receivers_prefetched_messages(ns_path):
    """A receive served partly from the prefetch cache whose fetch of more is throttled leaves the cache
    as it was: the next receive hands out those messages (before, they were dropped and stayed locked)."""
    _filled(ns_path, 300, credits=100)
    receiver = ServiceBusClient(ns_path, retry_total=0).get_queue_receiver("q", prefetch_count=5)
    [first] = receiver.receive_messages(1)  # 6 locked: 1 handed out, 5 cached
    _in_debt(ns_path, 300)  # about 2 s of credits owed
    with pytest.raises(ServiceBusServerBusyError):
        receiver.receive_messages(10)  # 5 from the cache, the rest refused
    cached = receiver.receive_messages(5, max_wait_time=0)
    assert [m.sequence_number for m in cached] == [first.sequence_number + i for i in range(1, 6)]
    receiver.complete_messages([first, *cached])


def test_a_throttled_request_succeeds_once_credits_return_and_is_stored_once(ns_path):
    _filled(ns_path, 3000)
    _in_debt(ns_path, 3000)
    started = time.monotonic()
    client = ServiceBusClient(ns_path, retry_total=10, retry_backoff_factor=0.2, retry_backoff_max=1)
    client.get_queue_sender("q").send_messages(ServiceBusMessage("after", message_id="after"))
    assert time.monotonic() - started >= 1.0  # waited for at least two replenishments (-2,000 owed)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    ids = stored_messages(admin, "q")["message_id"].to_pylist()
    assert ids.count("after") == 1 and len(ids) == 3001
    metrics = admin.get_entity_metrics("q")
    assert metrics.throttled_requests >= 1
    assert metrics.incoming_messages == 3001 and metrics.credits_used == 3000 + 3000 + 1


def test_management_costs_10_and_data_operations_1_per_message(ns_path):
    sparkbus.create_namespace(ns_path)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q")
    admin.get_queue("q")
    admin.list_queues()
    client = ServiceBusClient(ns_path)
    client.get_queue_sender("q").send_messages([ServiceBusMessage(str(i)) for i in range(5)])
    receiver = client.get_queue_receiver("q")
    got = receiver.receive_messages(max_message_count=3, max_wait_time=1)
    receiver.complete_messages(got)  # settlement is counted, not charged
    receiver.peek_messages(10)
    queue = admin.get_entity_metrics("q")
    assert (queue.incoming_messages, queue.outgoing_messages) == (5, 3)
    assert queue.credits_used == 5 + 3 + 2  # sent, received, peeked (the two left)
    assert queue.successful_requests == 4 and queue.throttled_requests == 0
    namespace = admin.get_namespace_metrics()
    assert namespace.credits_used == 3 * 10 + 10  # three management calls, plus the queue's 10 credits
    assert namespace.incoming_requests == namespace.successful_requests == 3 + 4


def test_fan_out_is_charged_one_credit_per_filter_evaluated(ns_path):
    sparkbus.create_namespace(ns_path)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_topic("t")
    admin.create_subscription("t", "all")                 # $Default: one filter
    admin.create_subscription("t", "two")
    admin.create_rule("t", "two", "red", filter=sparkbus.SqlRuleFilter("color = 'red'"))  # $Default + red
    ServiceBusClient(ns_path).get_topic_sender("t").send_messages(
        [ServiceBusMessage(str(i), application_properties={"color": "red"}) for i in range(10)])
    done = fanout.drain(open_catalog(ns_path), "t")
    assert done.evaluations == 10 * 3
    topic = admin.get_entity_metrics("t")
    assert topic.credits_used == 10 + 30  # the send, then every filter evaluated for every message


def test_a_dataframe_send_goes_through_then_the_namespace_waits(ns_path, spark):
    sparkbus.create_namespace(ns_path)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("q")
    client = ServiceBusClient(ns_path, spark=spark, retry_total=0)
    sender = client.get_queue_sender("q")
    df = spark.range(5000).selectExpr("CAST(id AS STRING) AS body")
    assert sender.send_dataframe(df).message_count == 5000  # admitted with a positive balance
    with pytest.raises(ServiceBusServerBusyError, match="Error code: 50009"):
        sender.send_messages(ServiceBusMessage("next"))
    started = time.monotonic()
    patient = ServiceBusClient(ns_path, retry_total=20, retry_backoff_factor=0.2, retry_backoff_max=0.5)
    patient.get_queue_sender("q").send_messages(ServiceBusMessage("next"))
    waited = time.monotonic() - started
    assert 2.5 <= waited <= 30  # -4,000 owed: admitted about four to five seconds after the send


# ---- the budget is the namespace's: spawned processes share it ------------------------------------------

THREADS = 48
READ = 2500  # credits a reader of the namespace spends as the burst starts


def _burst(path: str, worker: int, count: int, threads: int, barrier, results) -> None:
    """Send count single messages to 'burst' from `threads` threads (worker 0 first peeks READ messages of
    'q', another workload of the namespace); puts (worker, seconds)."""
    client = ServiceBusClient(path, retry_total=30, retry_backoff_factor=0.1, retry_backoff_max=0.5)
    sender = client.get_queue_sender("burst")
    share = [list(range(t, count, threads)) for t in range(threads)]

    def send(numbers: list[int]) -> None:
        for n in numbers:
            sender.send_messages(ServiceBusMessage(f"{worker}-{n}", message_id=f"{worker}-{n}"))
    pool = [threading.Thread(target=send, args=(numbers,)) for numbers in share]
    barrier.wait()
    started = time.monotonic()
    for t in pool:
        t.start()
    if worker == 0:
        assert len(client.get_queue_receiver("q").peek_messages(READ, sequence_number=1)) == READ
    for t in pool:
        t.join()
    elapsed = time.monotonic() - started
    client.close()  # persists this process's metrics
    results.put((worker, elapsed))


@pytest.mark.slow
def test_a_burst_from_two_processes_shares_one_budget(ns_path, spawn):
    _filled(ns_path, READ)  # then the default budget: 1,000 credits per second
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("burst")
    # 48 threads a process: their sends share commits (group commit), so the two processes ask for about
    # as much as the budget gives; the reader's peek leaves the namespace 1,500 credits or more in debt
    # at once, so sends are throttled however fast this machine is today.
    outcomes = run_spawned(spawn, _burst, [(ns_path, w, 1500, THREADS) for w in range(2)])
    ids = stored_messages(admin, "burst")["message_id"].to_pylist()
    assert sorted(ids) == sorted(f"{w}-{n}" for w in range(2) for n in range(1500))  # each exactly once
    usage = admin.get_entity_metrics("burst")
    assert usage.throttled_requests > 0, usage
    assert usage.incoming_messages == usage.credits_used == 3000
    assert admin.get_entity_metrics("q").credits_used == READ + READ  # filled (unthrottled), then peeked
    # 5,500 credits at 1,000 per period, from at most a full bucket: admissions may overdraw (the peek by
    # up to 2,499, each concurrent send by 1), so at least two replenishments, more than a second; and
    # never more than a full bucket per period crossed.
    elapsed = max(seconds for _, seconds in outcomes)
    assert elapsed > 1.0, elapsed
    assert 3000 + READ <= 1000 * (int(elapsed) + 2) + READ + 2 * THREADS, elapsed


# ---- premium: the governor ------------------------------------------------------------------------------

def _admitted(receiver, clock, periods: int) -> int:
    """Credits the receiver's namespace governor admits over `periods` one-second credit periods of the
    service clock to requests of 1,000 credits that do nothing else (retry_total=0): the clock moves to the
    start of each period, and requests go until one is refused, so the budget, not the machine's speed,
    bounds the count."""
    admitted = 0
    for _ in range(periods):
        clock.advance(1 - clock.time() % 1 + 0.001)  # the start of the next period
        while True:
            try:
                receiver._governor.call("q", lambda: None, lambda _: Usage(1000), NO_RETRY)
                admitted += 1000
            except ServiceBusServerBusyError:
                break
    return admitted


@pytest.mark.slow
def test_premium_scaling_from_1_to_2_messaging_units_raises_the_admitted_rate(ns_path, clock):
    sparkbus.create_namespace(ns_path, tier="premium", messaging_units=1)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q")
    with ServiceBusClient(ns_path).get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(str(i)) for i in range(1000)])
    receiver = ServiceBusClient(ns_path, retry_total=0).get_queue_receiver("q")
    one = _admitted(receiver, clock, 3)
    admin.update_namespace(messaging_units=2)  # the running receiver follows at its next operation
    assert admin.get_namespace_properties().messaging_units == 2
    two = _admitted(receiver, clock, 3)
    # a period admits its credits per unit (one more period's if a real second ends mid-count)
    unit = throttling.PREMIUM_CREDITS_PER_UNIT
    assert 3 * unit <= one < 4 * unit and two >= 3 * 2 * unit, (one, two)
    metrics = admin.get_namespace_metrics()
    assert metrics.throttled_requests > 0
    assert metrics.cpu_percent is not None and metrics.memory_percent is not None  # premium resources


def _hold_slots(path: str, count: int, ready, _results) -> None:
    slots = Slots(path)
    for _ in range(count):
        assert slots.take(count) is not None
    ready.wait()
    time.sleep(600)


def test_premium_concurrency_is_bounded_across_processes_and_a_dead_holder_frees_its_slots(ns_path, spawn):
    sparkbus.create_namespace(ns_path, tier="premium", messaging_units=1)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("q")
    limit = throttling.budget("premium", None, 1).concurrency
    ready = spawn.Barrier(2)
    holder = spawn.Process(target=_hold_slots, args=(os.path.abspath(ns_path), limit, ready, None))
    holder.start()
    try:
        ready.wait(timeout=60)  # every slot is held by another process
        receiver = ServiceBusClient(ns_path, retry_total=0).get_queue_receiver("q")
        with pytest.raises(ServiceBusServerBusyError) as busy:
            receiver.peek_messages(1)
        assert str(busy.value) == TEXT
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # a crashed client: the kernel releases its locks
        holder.join(timeout=30)
    assert receiver.peek_messages(1) == []


def test_update_namespace_checks_its_arguments_and_writes_nothing_on_error(ns_path):
    sparkbus.create_namespace(ns_path)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    with pytest.raises(ValueError, match="messaging_units applies to the premium tier only"):
        admin.update_namespace(messaging_units=2)
    with pytest.raises(ValueError, match="credits_per_second must be between 1 and"):
        admin.update_namespace(credits_per_second=0)
    with pytest.raises(TypeError, match="update_namespace takes"):
        admin.update_namespace()
    assert admin.get_namespace_properties().credits_per_second == 1000
    premium = str(os.path.join(os.path.dirname(ns_path), "premium"))
    sparkbus.create_namespace(premium, tier="premium")
    with pytest.raises(ValueError, match="premium messaging_units must be one of"):
        sparkbus.ServiceBusAdministrationClient(premium).update_namespace(messaging_units=3)
    assert sparkbus.ServiceBusAdministrationClient(premium).get_namespace_properties().messaging_units == 1


# ---- metrics: persisted by every process, read by any ----------------------------------------------------

def _send_and_close(path: str, count: int, barrier, results) -> None:
    barrier.wait()
    with ServiceBusClient(path) as client:  # closing persists the process's metrics
        client.get_queue_sender("q").send_messages([ServiceBusMessage(str(i)) for i in range(count)])
    results.put(count)


def test_metrics_persisted_by_other_processes_are_read_plotted_and_listed(ns_path, spawn, tmp_path):
    import subprocess
    import sys

    from sparkbus.metrics import metrics_table

    sparkbus.create_namespace(ns_path)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("q")
    run_spawned(spawn, _send_and_close, [(ns_path, 7), (ns_path, 5)])
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    queue = admin.get_entity_metrics("q")  # only other processes sent: all of it came from the table
    assert (queue.incoming_messages, queue.successful_requests, queue.credits_used) == (12, 2, 12)
    assert sum(p.incoming_messages for p in queue.points) == 12
    rows = metrics_table(ns_path).to_pylist()
    assert len({r["process"] for r in rows if r["entity"] == "q"}) == 2  # one row per process
    png = tmp_path / "metrics.png"
    cli = [sys.executable, "-m", "sparkbus.cli"]
    shown = subprocess.run([*cli, "metrics", "--namespace", ns_path, "--entity", "q", "--plot", str(png)],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "incoming_messages=12" in shown.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    changed = subprocess.run([*cli, "update-namespace", "--namespace", ns_path, "--credits-per-second", "250"],
                             capture_output=True, text=True, timeout=120)
    assert changed.returncode == 0 and "credits=250/s" in changed.stdout
    assert admin.get_namespace_properties().credits_per_second == 250
    refused = subprocess.run([*cli, "update-namespace", "--namespace", ns_path, "--credits-per-second", "many"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "takes a whole number or 'off'" in refused.stderr  # a bad argument


def test_forwarding_waits_for_credits_instead_of_failing(ns_path):
    from sparkbus.engine.forwarding import forward_all

    _filled(ns_path, 2500)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("dst")
    admin.create_queue("src", forward_to="dst")
    ServiceBusClient(ns_path).get_queue_sender("src").send_messages([ServiceBusMessage(str(i)) for i in range(10)])
    _in_debt(ns_path, 2500)  # at least 1,500 credits owed
    started = time.monotonic()
    done = forward_all(open_catalog(ns_path))
    assert time.monotonic() - started > 0.5  # it waited for a replenishment or two (at least one boundary)
    assert done.forwarded == {"src": 10}
    assert sorted(str(m) for m in ServiceBusClient(ns_path).get_queue_receiver("dst").peek_messages(20)) == \
        sorted(str(i) for i in range(10))
    destination = admin.get_entity_metrics("dst")
    assert destination.throttled_requests >= 1 and destination.incoming_messages == 10
    assert destination.credits_used == 10 + 10  # the forwarded copies as a send, and the peek above


def test_the_metrics_plot_is_readable_for_a_short_run():
    """One minute with one throttled request: bars from zero with headroom (not a panel filled by one
    request, nor a flat axis from -0.04 to 0.04), minute ticks, the namespace in the title."""
    from datetime import datetime, timedelta, timezone

    import matplotlib
    from matplotlib import dates
    from matplotlib.figure import Figure

    from sparkbus.engine.metrics import Metrics, MetricsPoint
    from sparkbus.metrics import _draw, plot_metrics

    minute = datetime(2026, 11, 25, 6, 30, tzinfo=timezone.utc)
    report = Metrics(entity="q", points=(MetricsPoint(time_utc=minute, incoming_messages=120, throttled_requests=1,
                                                     credits_used=0),))
    top, bottom = Figure().subplots(2, 1, sharex=True)
    _draw(report, top, bottom)
    assert top.get_ylim() == (0, 150) and bottom.get_ylim() == (0, 5)
    assert bottom.figure.axes[-1].get_ylim() == (0, 1)  # credits: all zero, still 0 to 1
    low, high = bottom.get_xlim()
    assert dates.num2date(low) < minute < dates.num2date(high) and (high - low) * 24 * 60 == pytest.approx(1.5)
    assert top.get_ylabel() == "messages per minute"
    fine = Metrics(entity="q", period=timedelta(seconds=10), points=report.points)
    top, bottom = Figure().subplots(2, 1, sharex=True)
    _draw(fine, top, bottom)  # a short run per ten seconds: bars a tenth-minute wide, labelled so
    low, high = bottom.get_xlim()
    assert (high - low) * 24 * 3600 == pytest.approx(15) and top.get_ylabel() == "messages per 10 s"
    backend = matplotlib.get_backend()
    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        path = plot_metrics(report, f"{directory}/m.png", namespace="/data/sb/prod")
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == backend  # a notebook's inline plots keep working


def test_metrics_are_kept_per_ten_seconds_and_read_per_any_multiple_of_it(ns_path):
    """Rows of two processes in three ten-second buckets of one minute and one of the next: per 10 s each
    bucket is a point, per minute they add up, and the premium CPU share of a period is the mean over its
    sampled buckets of what the processes used together."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    from sparkbus.engine import metrics
    from sparkbus.metrics import fitting_period, format_metrics, parse_period, period_name
    from sparkbus.storage import location
    from sparkbus.core.schemas import METRICS, METRICS_COUNTERS

    sparkbus.create_namespace(ns_path)
    start = datetime(2026, 11, 25, 8, 0, tzinfo=timezone.utc)
    rows = []
    for seconds, process, incoming, cpu in ((0, "a", 1, 10.0), (0, "b", 2, 20.0), (10, "a", 4, None),
                                            (50, "b", 8, 30.0), (60, "a", 16, None)):
        row = {name: 0 for name in METRICS_COUNTERS}
        row.update(time_utc=start + timedelta(seconds=seconds), entity="", process=process,
                   incoming_messages=incoming, incoming_requests=1, cpu_percent=cpu,
                   memory_percent=None if cpu is None else 1.0)
        rows.append(row)
    metrics._append(location.join(ns_path, metrics.METRICS_DIR), pa.Table.from_pylist(rows, schema=METRICS))
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    fine = admin.get_namespace_metrics(period=timedelta(seconds=10), start_time=start)
    assert [(p.time_utc - start).seconds for p in fine.points] == [0, 10, 50, 60]
    assert [p.incoming_messages for p in fine.points] == [3, 4, 8, 16]
    assert [p.cpu_percent for p in fine.points] == [30.0, None, 30.0, None]  # a and b together at 0 s
    minutes = admin.get_namespace_metrics(start_time=start)
    assert [(p.time_utc - start).seconds for p in minutes.points] == [0, 60]
    assert [p.incoming_messages for p in minutes.points] == [15, 16] and minutes.incoming_messages == 31
    assert minutes.points[0].cpu_percent == 30.0 and minutes.points[1].cpu_percent is None
    assert minutes.period == timedelta(minutes=1) and fine.period == timedelta(seconds=10)
    assert admin.get_namespace_metrics(period=timedelta(minutes=2), start_time=start).points[0].incoming_messages == 31
    assert fitting_period(minutes) == timedelta(seconds=10)  # a run of two minutes reads best in detail
    text = format_metrics(fine).splitlines()
    assert text[1].split()[:2] == ["time", "(UTC)"] and text[2].startswith("2026-11-25 08:00:00")
    for bad in (timedelta(seconds=15), timedelta(0), timedelta(seconds=-10)):
        with pytest.raises(ValueError, match="metrics period must be a positive multiple of 10 seconds"):
            admin.get_namespace_metrics(period=bad)
    assert [parse_period(t) for t in ("10s", "1m", "5m", "2h")] == [
        timedelta(seconds=10), timedelta(minutes=1), timedelta(minutes=5), timedelta(hours=2)]
    for bad in ("7s", "m", "1d", "ten s", ""):
        with pytest.raises(ValueError):
            parse_period(bad)
    assert [period_name(parse_period(t)) for t in ("10s", "90s", "1m", "5m", "1h", "2h")] == [
        "10 s", "90 s", "minute", "5 min", "hour", "2 h"]


def test_a_namespace_context_keeps_this_process_state_until_closed_or_discarded(ns_path):
    """The process's state of a namespace (sparkbus.engine.context) is made at first use and shared by its
    clients: the governor, the unpersisted counts, the partitions found faulty. close() persists the counts
    and forgets the rest; the next use starts afresh; discard() drops the counts unwritten."""
    from sparkbus.engine import availability, context, metrics

    sparkbus.create_namespace(ns_path, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("q", enable_partitioning=True)
    client = ServiceBusClient(ns_path)
    root = client.fully_qualified_namespace
    client.get_queue_sender("q").send_messages(ServiceBusMessage("counted"))
    held = context.known(root)
    assert held is not None and held.governor is not None
    assert ServiceBusClient(ns_path)._governor is held.governor  # one per namespace and process
    counted = held.recorder.pending().num_rows
    assert counted == 2  # the queue's creation (the namespace's row) and the send, not persisted yet
    availability.report_fault(root, "q", 3)
    assert availability.detected_faults(root, "q") == {3}

    def persisted() -> int:
        return metrics.all_rows(root, None).num_rows
    context.close(root)
    assert persisted() == counted and context.known(root) is None
    assert availability.detected_faults(root, "q") == frozenset()  # forgotten with the context
    client.get_queue_sender("q").send_messages(ServiceBusMessage("after"))
    fresh = context.known(root)
    assert fresh is not None and fresh is not held and fresh.governor is not held.governor
    context.discard(root)
    assert persisted() == counted and fresh.recorder.pending().num_rows == 0  # the second send's counts dropped


def test_a_metrics_table_written_before_the_processing_counters_gains_them(ns_path):
    """A metrics table of the columns an earlier version wrote: its rows read with the processing counters
    at 0, and the first append of this version adds the columns (a processor's counts then read back)."""
    from datetime import datetime, timezone

    import pyarrow as pa

    from sparkbus.core.schemas import METRICS, PROCESSING_COUNTERS
    from sparkbus.engine import metrics
    from sparkbus.storage import location
    from sparkbus import storage

    sparkbus.create_namespace(ns_path)
    uri = location.join(ns_path, metrics.METRICS_DIR)
    earlier = pa.schema([f for f in METRICS if f.name not in PROCESSING_COUNTERS])
    storage.create_table(uri, earlier, partition_by=())
    row = {f.name: 0 for f in earlier} | {"time_utc": datetime.now(timezone.utc), "entity": "q", "process": "old",
                                          "incoming_messages": 5, "cpu_percent": None, "memory_percent": None}
    storage.write(uri, pa.Table.from_pylist([row], schema=earlier), mode="append")
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q")
    before = admin.get_entity_metrics("q")
    assert before.incoming_messages == 5 and before.processed_messages == 0
    with sparkbus.ServiceBusClient(ns_path) as client:
        client.get_queue_sender("q").send_messages(sparkbus.ServiceBusMessage("m"))
        client.get_queue_processor("q", lambda context: None).run(until_idle=1)
    # (the client's close persisted its process's counts: an append naming the new columns)
    table = storage.open_table(uri)
    assert set(PROCESSING_COUNTERS) <= {f.name for f in table.schema().fields}
    after = admin.get_entity_metrics("q")
    assert (after.incoming_messages, after.processed_messages) == (6, 1)
