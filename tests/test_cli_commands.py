"""What Service Bus Explorer makes one click, from the command line: purge, receive a deferred message and
resubmit a dead-lettered one by sequence number, peek from a number with each message's state, typed
properties on send, the namespace from $SPARKBUS_NAMESPACE, durations as seconds or ISO 8601, cut cells that
say so, a help that lists each command once, metrics without empty columns, correlation filter fields kept
as text."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from sparkbus import CorrelationRuleFilter, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from sparkbus.cli import COMMAND_GROUPS, main


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def _sent(ns_path: str, queue: str, bodies: list[str]) -> None:
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender(queue).send_messages([ServiceBusMessage(b) for b in bodies])


def test_purge_empties_a_queue_a_subscription_and_a_dead_letter_sub_queue(admin, ns_path, capsys):
    admin.create_queue("orders")
    admin.create_topic("events")
    admin.create_subscription("events", "all")
    _sent(ns_path, "orders", ["a", "b", "c"])
    with ServiceBusClient(ns_path) as client:
        client.get_topic_sender("events").send_messages(ServiceBusMessage("e"))
        with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
            [first] = receiver.receive_messages(1)
            receiver.dead_letter_message(first, reason="bad")
    assert main(["queue", "purge", "orders", "--namespace", ns_path]) == 0
    assert capsys.readouterr().out.strip() == "purged 2 message(s) from queue orders"
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (0, 1)
    assert main(["queue", "purge", "orders", "--from-dead-letter", "--namespace", ns_path, "--json"]) == 0
    assert _lines(capsys) == [{"purged": 1}]
    assert admin.get_queue_runtime_properties("orders").total_message_count == 0
    from sparkbus.engine import fanout  # (the copy reaches the subscription by fan-out)
    from sparkbus.engine.catalog import Catalog
    from sparkbus.storage.location import normalize
    fanout.drain(Catalog(normalize(ns_path)), "events")
    assert admin.get_subscription_runtime_properties("events", "all").active_message_count == 1
    assert main(["subscription", "purge", "all", "--topic", "events", "--namespace", ns_path]) == 0
    assert "purged 1 message(s) from subscription all" in capsys.readouterr().out
    assert admin.get_subscription_runtime_properties("events", "all").total_message_count == 0


def test_receive_a_deferred_message_and_resubmit_a_dead_lettered_one_by_sequence_number(admin, ns_path, capsys):
    admin.create_queue("q")
    _sent(ns_path, "q", ["keep", "later", "broken", "other"])
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("q", max_wait_time=1) as receiver:
        got = {str(m): m for m in receiver.receive_messages(4)}
        receiver.defer_message(got["later"])
        receiver.dead_letter_message(got["broken"], reason="bad")
        receiver.dead_letter_message(got["other"], reason="bad too")
        receiver.abandon_message(got["keep"])
    later, broken = got["later"].sequence_number, got["broken"].sequence_number
    assert main(["receive", "--entity", "q", "--sequence-number", str(later), "--namespace", ns_path, "--json"]) == 0
    assert [m["body"] for m in _lines(capsys)] == ["later"]
    assert main(["receive", "--entity", "q", "--sequence-number", str(later), "--namespace", ns_path]) == 1
    assert f"no deferred, unlocked message with sequence number(s) [{later}]" in capsys.readouterr().err
    assert main(["dead-letter", "resubmit", "--entity", "q", "--sequence-number", str(broken),
                 "--namespace", ns_path]) == 0
    assert "resubmitted 1 message(s) from q to q" in capsys.readouterr().out
    with ServiceBusClient(ns_path) as client:
        assert sorted(str(m) for m in client.get_queue_receiver("q").peek_messages(10)) == ["broken", "keep"]
        [left] = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER).peek_messages(10)
    assert str(left) == "other"  # the one not named stays dead-lettered
    assert main(["dead-letter", "resubmit", "--entity", "q", "--sequence-number", str(broken),
                 "--namespace", ns_path]) == 1  # already resubmitted: nothing is sent twice
    assert "no dead-lettered, unlocked message" in capsys.readouterr().err
    assert admin.get_queue_runtime_properties("q").active_message_count == 2


def test_peek_starts_at_a_sequence_number_and_shows_each_messages_state(admin, ns_path, capsys):
    admin.create_queue("q")
    _sent(ns_path, "q", ["m1", "m2", "m3", "m4"])
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("q", max_wait_time=1) as receiver:
        [first] = receiver.receive_messages(1)
        receiver.defer_message(first)
    assert main(["peek", "--entity", "q", "--namespace", ns_path, "--json"]) == 0
    assert [(m["body"], m["state"]) for m in _lines(capsys)] == [
        ("m1", "deferred"), ("m2", "active"), ("m3", "active"), ("m4", "active")]
    assert main(["peek", "--entity", "q", "--from-sequence-number", "3", "--namespace", ns_path]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["sequence_number", "state"]
    assert [line.split()[:2] for line in table[2:]] == [["3", "active"], ["4", "active"]]
    assert main(["dead-letter", "list", "--entity", "q", "--namespace", ns_path]) == 0
    assert capsys.readouterr().out.strip() == "no messages"


def test_send_takes_typed_properties_and_refuses_unknown_fields(admin, ns_path, tmp_path, capsys):
    admin.create_queue("q")
    assert main(["send", "--entity", "q", "--body", "hi", "--property", "n=5", "--property", "ok=true",
                 "--property", "price=2.5", "--property", "region=eu", "--property", "code=007x",
                 "--namespace", ns_path]) == 0
    with ServiceBusClient(ns_path) as client:
        [message] = client.get_queue_receiver("q").peek_messages(1)
    assert message.str_application_properties == {"n": 5, "ok": True, "price": 2.5, "region": "eu", "code": "007x"}
    lines = tmp_path / "m.jsonl"
    lines.write_text('{"body": "x", "colour": "red"}\n')
    assert main(["send", "--entity", "q", "--file", str(lines), "--namespace", ns_path]) == 1
    assert "m.jsonl line 1: unknown field(s) ['colour']; allowed: body, application_properties" in capsys.readouterr().err
    assert main(["send", "--entity", "q", "--body", "x", "--property", "novalue", "--namespace", ns_path]) == 2
    assert "argument --property: takes KEY=VALUE, got 'novalue'" in capsys.readouterr().err
    assert admin.get_queue_runtime_properties("q").total_message_count == 1


def test_the_namespace_comes_from_the_environment_when_not_given(admin, ns_path, monkeypatch, capsys):
    admin.create_queue("q")
    monkeypatch.setenv("SPARKBUS_NAMESPACE", ns_path)
    assert main(["send", "--entity", "q", "--body", "from env"]) == 0
    assert capsys.readouterr().out.strip() == "sent 1 message(s) to q"
    assert main(["queue", "list", "--json"]) == 0
    assert [q["name"] for q in _lines(capsys)] == ["q"]
    assert main(["queue", "list", "--namespace", str(ns_path) + "-other"]) == 1  # --namespace still wins
    capsys.readouterr()
    monkeypatch.delenv("SPARKBUS_NAMESPACE")
    assert main(["queue", "list"]) == 2
    assert "the following arguments are required: --namespace" in capsys.readouterr().err


def test_durations_are_seconds_or_iso_8601(admin, ns_path, capsys):
    assert main(["queue", "create", "a", "--set", "lock_duration=30", "--set", "default_message_time_to_live=3600.5",
                 "--namespace", ns_path]) == 0
    assert main(["queue", "create", "b", "--set", "lock_duration=PT45S", "--namespace", ns_path]) == 0
    assert admin.get_queue("a").lock_duration == timedelta(seconds=30)
    assert admin.get_queue("a").default_message_time_to_live == timedelta(seconds=3600.5)
    assert admin.get_queue("b").lock_duration == timedelta(seconds=45)
    capsys.readouterr()
    assert main(["queue", "create", "c", "--set", "lock_duration=soon", "--namespace", ns_path]) == 2
    assert "lock_duration takes seconds (a number) or an ISO 8601 duration such as PT30S, got 'soon'" in \
        capsys.readouterr().err
    assert main(["queue", "create", "c", "--set", "lock_duration=-5", "--namespace", ns_path]) == 2
    assert "lock_duration takes seconds from 0" in capsys.readouterr().err
    assert [q.name for q in admin.list_queues()] == ["a", "b"]  # nothing made of the refused ones
    assert main(["receive", "--entity", "a", "--wait", "PT0.5S", "--namespace", ns_path]) == 0
    assert capsys.readouterr().out.strip() == "no messages"
    assert main(["receive", "--entity", "a", "--wait", "PT2D", "--namespace", ns_path]) == 2
    assert "takes seconds from 0 up to 86400 (a number, or an ISO 8601 duration such as PT30S)" in capsys.readouterr().err


def test_cut_cells_end_in_a_mark_and_json_keeps_them_whole(admin, ns_path, capsys):
    admin.create_queue("q")
    reason = "Message could not be consumed after 2 delivery attempts"
    _sent(ns_path, "q", ["b" * 39, "c" * 41])
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("q", max_wait_time=1) as receiver:
        for message in receiver.receive_messages(2):
            receiver.dead_letter_message(message, reason=reason)
    assert main(["dead-letter", "list", "--entity", "q", "--namespace", ns_path]) == 0
    out = capsys.readouterr().out
    assert "b" * 39 + " " in out and "c" * 39 + "…" in out and "c" * 40 not in out
    assert reason[:39] + "…" in out and reason not in out
    assert main(["dead-letter", "list", "--entity", "q", "--namespace", ns_path, "--json"]) == 0
    assert {m["dead_letter_reason"] for m in _lines(capsys)} == {reason}


def test_help_lists_each_command_once_by_group_and_options_where_they_apply(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("  -")]
    assert listed == [name for _, names in COMMAND_GROUPS for name in names]
    assert len(listed) == len(set(listed)) == 24 and out.count("\n  dead-letter ") == 1 and "replay" in listed
    assert out.splitlines()[0] == "usage: sparkbus [-h] [--version] <command> ..."
    assert main(["peek", "--help"]) == 0
    peek = capsys.readouterr().out
    assert "--wait" not in peek and "(receive)" not in peek and "--from-sequence-number" in peek
    assert main(["receive", "--help"]) == 0
    assert "--wait" in capsys.readouterr().out
    assert main(["queue", "--help"]) == 0
    assert {"purge", "update"} <= set(capsys.readouterr().out.replace(",", " ").replace("{", " ").replace("}", " ").split())
    assert main(["queu", "list"]) == 2
    assert capsys.readouterr().err.startswith("sparkbus: error: argument <command>: invalid choice: 'queu'; did you "
                                              "mean 'queue'? (see sparkbus --help)")


def test_metrics_of_a_standard_namespace_show_no_empty_columns(admin, ns_path, capsys):
    admin.create_queue("q")
    _sent(ns_path, "q", ["a"])
    assert main(["metrics", "--namespace", ns_path]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert header.split()[-2:] == ["msgs", "credits"] and "cpu" not in header and "mem" not in header


def test_correlation_filter_fields_stay_text_and_properties_are_typed(admin, ns_path, capsys):
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    assert main(["rule", "create", "r", "--topic", "t", "--subscription", "s", "--correlation", "correlation_id=5",
                 "--correlation", "subject=true", "--correlation", "n=5", "--correlation", "on=true",
                 "--namespace", ns_path]) == 0
    [rule] = [r for r in admin.list_rules("t", "s") if r.name == "r"]
    assert rule.filter == CorrelationRuleFilter(correlation_id="5", subject="true", properties={"n": 5, "on": True})
    with pytest.raises(TypeError, match="correlation_id must be a str, got int"):  # what typing it made before
        CorrelationRuleFilter(correlation_id=5)
