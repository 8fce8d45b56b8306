"""The sparkbus command and namespace definitions, run as real subprocesses where it matters."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
    assert "MessagingEntityNotFoundError" in capsys.readouterr().err


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
    assert table[0].split()[:2] == ["sequence_number", "enqueued_time_utc"] and len(table) == 2 + 4
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "2", "--json"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(m["body"], m["subject"], m["application_properties"]) for m in got] == [
        ("plain", None, {}), ("typed", "s", {"n": 1})]
    assert admin.get_queue_runtime_properties("q").active_message_count == 2  # received ones were completed
    lines.write_text('{"bod": 1}\n')
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines)]) == 1
    assert 'line 1: expected a string or an object with "body"' in capsys.readouterr().err
    assert main(["receive", "--namespace", ns_path, "--entity", "q", "--count", "0"]) == 1
    assert admin.get_queue_runtime_properties("q").active_message_count == 2  # nothing written or taken
