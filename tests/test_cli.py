"""The sparkbus command and namespace definitions, run as real subprocesses where it matters."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import sparkbus
from sparkbus import CorrelationRuleFilter, ServiceBusAdministrationClient, SqlRuleFilter
from sparkbus.cli import main
from sparkbus.definitions import apply_definition, load_definition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "conf", "namespace.toml")


def test_apply_example_definition_is_idempotent(ns_path):
    report = apply_definition(load_definition(EXAMPLE), ns_path)
    assert "created queue orders" in report.changes and "deleted rule events/eu-orders/$Default" in report.changes
    admin = ServiceBusAdministrationClient(ns_path)
    orders = admin.get_queue("orders")
    assert (orders.partition_count, orders.max_delivery_count, orders.requires_duplicate_detection) == (16, 5, True)
    rules = {r.name: r for r in admin.list_rules("events", "eu-orders")}
    assert set(rules) == {"eu-only"} and rules["eu-only"].filter == SqlRuleFilter("region = 'eu' AND sys.Label = 'order'")
    audit = admin.list_rules("events", "audit")[0].filter
    assert audit == CorrelationRuleFilter(subject="order", properties={"audited": True})
    assert admin.get_subscription("events", "audit").forward_to == "audit-archive"
    assert apply_definition(load_definition(EXAMPLE), ns_path).changes == []


def test_apply_updates_changed_settings(ns_path, tmp_path):
    first = tmp_path / "a.toml"
    first.write_text('[[queues]]\nname = "q"\nmax_delivery_count = 3\n')
    apply_definition(load_definition(str(first)), ns_path)
    first.write_text('[[queues]]\nname = "q"\nmax_delivery_count = 4\n')
    report = apply_definition(load_definition(str(first)), ns_path)
    assert report.changes == ["updated queue q: ['max_delivery_count']"]
    assert ServiceBusAdministrationClient(ns_path).get_queue("q").max_delivery_count == 4


def test_bad_definitions(ns_path, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[exchanges]]\nname = "x"\n')
    with pytest.raises(ValueError, match="unknown section"):
        load_definition(str(bad))
    bad.write_text('[[queues]]\nmax_delivery_count = 3\n')
    with pytest.raises(ValueError, match="needs a name"):
        apply_definition(load_definition(str(bad)), ns_path)


def test_cli_apply_show_and_partition(ns_path, capsys):
    assert main(["apply", EXAMPLE, "--namespace", ns_path]) == 0
    assert main(["partition", "--namespace", ns_path, "--entity", "orders", "--partition", "2", "--unavailable"]) == 0
    capsys.readouterr()
    assert main(["show", "--namespace", ns_path]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[1]: line.split() for line in out.splitlines()[3:]}
    assert lines["orders"][:5] == ["queue", "orders", "16", "Active", "Limited"]
    assert lines["events/Subscriptions/eu-orders"][:3] == ["subscription", "events/Subscriptions/eu-orders", "16"]
    assert set(lines) == {"orders", "invoices", "audit-archive", "events", "events/Subscriptions/all",
                          "events/Subscriptions/eu-orders", "events/Subscriptions/audit",
                          "events/Subscriptions/large-orders"}


def test_cli_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["show", "--namespace", str(tmp_path / "none")]) == 1
    error = capsys.readouterr().err
    assert "MessagingEntityNotFoundError" in error
    assert f"`sparkbus namespace create --namespace {tmp_path / 'none'}`" in error
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"sparkbus {sparkbus.__version__}\n"


def test_console_script_in_fresh_process(ns_path):
    exe = os.path.join(os.path.dirname(sys.executable), "sparkbus")
    subprocess.run([exe, "apply", EXAMPLE, "--namespace", ns_path], check=True, capture_output=True)
    out = subprocess.run([exe, "show", "--namespace", ns_path], check=True, capture_output=True, text=True).stdout
    assert "tier=standard" in out and "events/Subscriptions/audit" in out


def test_send_peek_and_receive_from_the_command_line(admin, ns_path, tmp_path, capsys):
    import json

    admin.create_queue("q")
    lines = tmp_path / "messages.jsonl"
    lines.write_text('"plain"\n\n{"body": "typed", "subject": "s", "application_properties": {"n": 1}}\n')
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines)]) == 0
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--body", "a", "--body", "b", "--json"]) == 0
    assert capsys.readouterr().out.splitlines() == ["sent 2 message(s) to q", '{"sent": 2}']
    assert main(["peek", "--namespace", ns_path, "--entity", "q", "--count", "10"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["sequence_number", "state", "enqueued_time_utc"] and len(table) == 2 + 4
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "2", "--json"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(m["body"], m["subject"], m["application_properties"]) for m in got] == [
        ("plain", None, {}), ("typed", "s", {"n": 1})]
    assert admin.get_queue_runtime_properties("q").active_message_count == 2  # received ones were completed
    lines.write_text('{"bod": 1}\n')
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines)]) == 1
    assert 'line 1: expected a string or an object with "body"' in capsys.readouterr().err
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "0"]) == 2  # a bad argument
    assert "argument --count: takes a whole number from 1" in capsys.readouterr().err
    assert admin.get_queue_runtime_properties("q").active_message_count == 2  # nothing written or taken


def _json_lines(capsys) -> list:
    import json
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_namespace_entities_and_rules_from_the_command_line(tmp_path, capsys):
    ns = str(tmp_path / "ns")
    assert main(["namespace", "create", "--namespace", ns, "--credits-per-second", "off", "--json"]) == 0
    assert _json_lines(capsys)[0]["credits_per_second"] is None
    assert main(["queue", "create", "orders", "--namespace", ns, "--set", "max_delivery_count=3",
                 "--set", "lock_duration=PT10S", "--set", "requires_session=true", "--json"]) == 0
    created = _json_lines(capsys)[0]
    assert (created["max_delivery_count"], created["lock_duration"], created["requires_session"]) == (3, "PT10S", True)
    assert main(["topic", "create", "t", "--namespace", ns]) == 0
    assert main(["subscription", "create", "s", "--topic", "t", "--namespace", ns]) == 0
    assert main(["rule", "create", "big", "--topic", "t", "--subscription", "s", "--namespace", ns,
                 "--sql", "n > 1", "--action", "SET big = TRUE"]) == 0
    assert main(["rule", "create", "red", "--topic", "t", "--subscription", "s", "--namespace", ns,
                 "--correlation", "subject=order", "--correlation", "color=red"]) == 0
    capsys.readouterr()
    assert main(["rule", "list", "--topic", "t", "--subscription", "s", "--namespace", ns, "--json"]) == 0
    rules = {r["name"]: r for r in _json_lines(capsys)}
    assert rules["big"]["filter"]["sql_expression"] == "n > 1" and rules["big"]["action"] == "SET big = TRUE"
    admin = ServiceBusAdministrationClient(ns)
    red = admin.get_rule("t", "s", "red").filter
    assert (red.subject, red.properties) == ("order", {"color": "red"})
    assert main(["queue", "list", "--namespace", ns]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["name", "status", "partition_count", "max_size_in_megabytes", "requires_session"]
    assert table[2].split()[:2] == ["orders", "Active"]
    assert main(["subscription", "runtime", "s", "--topic", "t", "--namespace", ns, "--json"]) == 0
    assert _json_lines(capsys)[0]["total_message_count"] == 0
    assert main(["rule", "delete", "big", "--topic", "t", "--subscription", "s", "--namespace", ns]) == 0
    assert main(["queue", "delete", "orders", "--namespace", ns]) == 0
    assert [q.name for q in admin.list_queues()] == [] and "big" not in [r.name for r in admin.list_rules("t", "s")]
    capsys.readouterr()
    # refused: one stderr line, exit code 1 (what sparkbus refuses) or 2 (a bad command line), nothing written
    assert main(["queue", "show", "orders", "--namespace", ns]) == 1
    assert "MessagingEntityNotFoundError" in capsys.readouterr().err
    assert main(["queue", "create", "q2", "--namespace", ns, "--set", "max_delivery_count"]) == 2
    assert "argument --set: takes NAME=VALUE" in capsys.readouterr().err
    assert main(["rule", "create", "x", "--topic", "t", "--subscription", "s", "--namespace", ns, "--sql", "a = 1",
                 "--correlation", "subject=x"]) == 2
    assert "argument --correlation: not allowed with argument --sql" in capsys.readouterr().err
    assert [q.name for q in admin.list_queues()] == [] and len(admin.list_rules("t", "s")) == 2
    assert main(["queue", "frobnicate", "--namespace", ns]) == 2
    assert capsys.readouterr().err.startswith("sparkbus queue: error: argument action: invalid choice: 'frobnicate'")


def test_dead_letter_list_resubmit_and_maintain(admin, client, ns_path, capsys):
    from datetime import timedelta

    from sparkbus import ServiceBusMessage
    from sparkbus.amqp import AmqpAnnotatedMessage

    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage("a", subject="s", application_properties={"n": 1},
                                                time_to_live=timedelta(hours=1)),
                              AmqpAnnotatedMessage(value_body={b"k": 2})])
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(2, max_wait_time=2)
        for m in got:
            receiver.dead_letter_message(m, reason="bad", error_description="why")
    assert main(["dead-letter", "list", "--entity", "q", "--namespace", ns_path, "--json"]) == 0
    listed = _json_lines(capsys)
    assert [(r["dead_letter_reason"], r["sequence_number"]) for r in listed] == [("bad", 1), ("bad", 2)]
    assert [r["dead_letter_error_description"] for r in listed] == ["why", "why"]
    assert main(["dead-letter", "list", "--entity", "q", "--namespace", ns_path]) == 0
    header, _, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["application_properties", "dead_letter_reason", "dead_letter_error_description"]
    assert first.split()[-4:] == ['{"n":', '1}', "bad", "why"]
    assert second.split()[-2:] == ["bad", "why"]
    assert main(["dead-letter", "resubmit", "--entity", "q", "--namespace", ns_path, "--json"]) == 0
    assert _json_lines(capsys) == [{"resubmitted": 2, "to": "q"}]
    with client.get_queue_receiver("q") as receiver:
        again = sorted(receiver.receive_messages(5, max_wait_time=2), key=lambda m: m.sequence_number)
        assert [(str(m), m.subject, m.str_application_properties, m.time_to_live, m.body_type) for m in again] == \
            [("a", "s", {"n": 1}, timedelta(hours=1), "data"), ("{b'k': 2}", None, {}, None, "value")]
        assert [m.message_id for m in again] == [m.message_id for m in got]
        receiver.complete_messages(again)
    assert admin.get_queue_runtime_properties("q").dead_letter_message_count == 0
    # maintain: retention removes settled rows once 2,000 can go (all but the partition's newest row)
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(str(i)) for i in range(2001)])
    with client.get_queue_receiver("q", receive_mode="receiveanddelete") as receiver:
        while receiver.receive_messages(1000, max_wait_time=1):
            pass
    assert main(["maintain", "--namespace", ns_path, "--json"]) == 0
    assert _json_lines(capsys) == [{"tables": 3, "removed": 2004}]


def test_a_subscription_named_without_its_segment_is_pointed_to(admin, ns_path, capsys):
    admin.create_topic("events")
    admin.create_subscription("events", "eu")
    assert main(["peek", "--namespace", ns_path, "--entity", "events/eu"]) == 1
    assert "no queue, topic or subscription 'events/eu'" in (error := capsys.readouterr().err)
    assert "the subscription is 'events/Subscriptions/eu'" in error
    assert main(["peek", "--namespace", ns_path, "--entity", "events/us"]) == 1
    assert "the subscription is" not in capsys.readouterr().err


def test_receive_settles_as_asked_and_send_takes_time_fields(admin, ns_path, tmp_path, capsys):
    from datetime import datetime, timedelta, timezone

    admin.create_queue("q")
    lines = tmp_path / "timed.jsonl"
    lines.write_text('{"body": "ttl", "time_to_live": 90}\n{"body": "iso", "time_to_live": "PT1H"}\n'
                     '{"body": "later", "scheduled_enqueue_time_utc": "2099-01-01T00:00:00"}\n')
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines)]) == 0
    peeked = {str(m): m for m in sparkbus.ServiceBusClient(ns_path).get_queue_receiver("q").peek_messages(10)}
    assert peeked["ttl"].time_to_live == timedelta(seconds=90) and peeked["iso"].time_to_live == timedelta(hours=1)
    assert peeked["later"].scheduled_enqueue_time_utc == datetime(2099, 1, 1, tzinfo=timezone.utc)
    capsys.readouterr()
    for settle in ("abandon", "defer"):
        assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "1", "--settle", settle,
                     "--json"]) == 0
        [got] = _json_lines(capsys)
        with sparkbus.ServiceBusClient(ns_path).get_queue_receiver("q") as receiver:
            if settle == "abandon":  # available again at once, delivered a second time
                [again] = receiver.receive_messages(max_wait_time=0)
                assert (again.sequence_number, again.delivery_count) == (got["sequence_number"], 2)
                receiver.abandon_message(again)
            elif settle == "defer":  # received again only by its number
                [deferred] = receiver.receive_deferred_messages(got["sequence_number"])
                receiver.defer_message(deferred)
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "1", "--settle", "dead-letter",
                 "--reason", "r", "--description", "d"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "dead-lettered 1 message"
    assert main(["dead-letter", "list", "--namespace", ns_path, "--entity", "q", "--json"]) == 0
    [dead] = _json_lines(capsys)
    assert (dead["dead_letter_reason"], dead["dead_letter_error_description"]) == ("r", "d")
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--from-dead-letter", "--json"]) == 0
    assert [m["body"] for m in _json_lines(capsys)] == [dead["body"]]
    # refused before anything is read: a reason without dead-lettering; bad time fields name their line
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--reason", "r"]) == 2
    assert "--reason and --description go with --settle dead-letter" in capsys.readouterr().err
    for line, says in (('{"body": "x", "time_to_live": 0}', "time_to_live must be more than 0 seconds"),
                       ('{"body": "x", "time_to_live": "soon"}', "is not an ISO 8601 duration"),
                       ('{"body": "x", "scheduled_enqueue_time_utc": 5}', "scheduled_enqueue_time_utc is an ISO 8601"),
                       ('{"body": {"a": 1}}', '"body" is a JSON object; a body is a string')):
        lines.write_text(f'"fine"\n{line}\n')
        assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines)]) == 1
        err = capsys.readouterr().err
        assert "timed.jsonl line 2: " in err and says in err, err
    assert admin.get_queue_runtime_properties("q").total_message_count == 2  # nothing more was sent


def test_typos_are_answered_with_a_suggestion_and_rules_and_never_read_plainly(tmp_path, capsys):
    ns = str(tmp_path / "ns")
    assert main(["namespace", "create", "--namespace", ns]) == 0
    for argv, says in ((["recieve", "--namespace", ns], "did you mean 'receive'?"),
                       (["queue", "creat", "q", "--namespace", ns], "did you mean 'create'?"),
                       (["queue", "list", "--namespace", ns, "--jsn"], "did you mean '--json'?"),
                       (["show", "--namspace", ns], "unrecognized option --namspace, did you mean '--namespace'?")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.splitlines()) == 1, err
    assert main(["queue", "create", "q", "--namespace", ns]) == 0
    assert main(["topic", "create", "t", "--namespace", ns]) == 0
    assert main(["subscription", "create", "s", "--topic", "t", "--namespace", ns]) == 0
    assert main(["rule", "create", "red", "--topic", "t", "--subscription", "s", "--namespace", ns,
                 "--correlation", "subject=order", "--correlation", "color=red"]) == 0
    capsys.readouterr()
    assert main(["queue", "show", "q", "--namespace", ns]) == 0
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if len(line.split()) > 1)
    assert shown["default_message_time_to_live"] == "never" and shown["auto_delete_on_idle"] == "never"
    assert main(["queue", "show", "q", "--namespace", ns, "--json"]) == 0
    assert _json_lines(capsys)[0]["default_message_time_to_live"] == "P10675199DT2H48M5.4775807S"  # as the service
    assert main(["rule", "list", "--topic", "t", "--subscription", "s", "--namespace", ns]) == 0
    table = capsys.readouterr().out
    assert "$Default  TRUE" in table and "correlation subject='order', color='red'" in table
    assert main(["rule", "list", "--topic", "t", "--subscription", "s", "--namespace", ns, "--json"]) == 0
    rules = {r["name"]: r["filter"] for r in _json_lines(capsys)}
    assert rules == {"$Default": {"type": "true"},
                     "red": {"type": "correlation", "subject": "order", "properties": {"color": "red"}}}


def test_show_plots_each_entitys_backlog_by_state_and_per_partition(admin, ns_path, tmp_path, capsys):
    """Keyed messages land where the partition hash puts them, the per-partition counts say so (every
    partition named), and `show --plot` draws them: bars as long as each state's count, a grid of counts."""
    from datetime import datetime, timedelta, timezone

    from sparkbus import ServiceBusClient, ServiceBusMessage
    from sparkbus.core.partitioning import partition_of
    from sparkbus.metrics import backlog_figure, namespace_backlog

    admin.create_queue("orders", enable_partitioning=True)
    admin.create_topic("events")
    admin.create_subscription("events", "all")
    keys = [f"customer-{i % 3}" for i in range(30)]
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("orders").send_messages([ServiceBusMessage(str(i), partition_key=k)
                                                         for i, k in enumerate(keys)])
        client.get_queue_sender("orders").schedule_messages(
            ServiceBusMessage("later", partition_key="customer-0"), datetime.now(timezone.utc) + timedelta(hours=1))
        with client.get_queue_receiver("orders", max_wait_time=0) as receiver:
            for message in receiver.receive_messages(4):
                receiver.dead_letter_message(message, reason="test")
        client.get_topic_sender("events").send_messages([ServiceBusMessage("e") for _ in range(5)])
    counts = admin.get_partition_message_counts("orders")
    assert sorted(counts) == list(range(16))  # every partition named
    expected = {p: 0 for p in range(16)}
    for key in keys + ["customer-0"]:
        expected[partition_of(key, 16)] += 1
    assert counts == expected
    backlog = {b.path: b for b in namespace_backlog(ns_path)}
    orders = backlog["orders"]
    assert (orders.active, orders.scheduled, orders.dead_letter, orders.transfer) == (26, 1, 4, 0)
    assert backlog["events"].awaiting_fanout == 5 and backlog["events"].partitions == {0: 5}
    assert backlog["events/Subscriptions/all"].partitions == {0: 0}
    figure = backlog_figure(list(backlog.values()))
    bars, grid = figure.axes[:2]
    widths = [round(patch.get_width()) for patch in bars.patches]  # per state, then per entity
    assert widths[:3] == [26, 5, 0] and widths[3:6] == [1, 0, 0] and widths[6:9] == [4, 0, 0]
    shown = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in grid.texts}
    assert all(shown[(p, 0)] == str(n) for p, n in expected.items()) and shown[(0, 1)] == "5" and shown[(0, 2)] == "0"
    figure.draw_without_rendering()  # the legend is under the bars, covering none of them
    [legend] = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["active", "scheduled", "dead-letter", "transfer"]
    assert not legend.get_window_extent().overlaps(bars.get_window_extent())
    png = tmp_path / "backlog.png"
    assert main(["show", "--namespace", ns_path, "--plot", str(png)]) == 0
    assert f"plot written to {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
