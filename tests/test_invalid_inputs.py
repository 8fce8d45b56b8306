"""Every invalid input of the documentation's table (docs/reference/invalid-inputs.md) gets the error the
table names, and nothing is written: the calls are read from the table and run as written, and every file under the test's
directory (the namespace and where the refused namespaces would have gone) is compared before and after."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pandas
import pytest

import sparkbus
from sparkbus import ServiceBusMessage
from sparkbus.definitions import apply_definition
from sparkbus.management import SqlRuleFilter
from sparkbus.storage import maintenance
from conftest import files_under

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reference",
                     "invalid-inputs.md")
ROW = re.compile(r"^\| `(?P<call>.+)` \| (?P<error>\w+) \| (?P<says>.*?) ?\|$")


def documented_calls() -> list[tuple[str, str, str]]:
    with open(TABLE, encoding="utf-8") as handle:
        text = handle.read()
    table = text.split("<!-- invalid-inputs:start -->", 1)[1].split("<!-- invalid-inputs:end -->", 1)[0]
    rows = [ROW.match(line) for line in [line for line in table.splitlines() if line.strip()][2:]]
    assert all(rows), "every row of the invalid-inputs table is | `call` | Error | message |"
    return [(m["call"], m["error"], m["says"]) for m in rows]


CALLS = documented_calls()


def stale_handles(admin, client) -> dict:
    """Handles of a queue `old` and a session queue `old-sq` that were deleted and created again since: a
    receiver holding a locked message (stale_msg) and a deferred one's number (stale_deferred), and a
    session receiver (stale_session); the new queues hold messages with the same sequence numbers."""
    admin.create_queue("old")
    admin.create_queue("old-sq", requires_session=True)
    with client.get_queue_sender("old") as sender:
        sender.send_messages([ServiceBusMessage("deferred"), ServiceBusMessage("locked")])
    with client.get_queue_sender("old-sq") as sender:
        sender.send_messages(ServiceBusMessage("in session", session_id="s1"))
    stale_receiver = client.get_queue_receiver("old", max_wait_time=2)
    deferred = stale_receiver.receive_messages(1)[0]
    stale_receiver.defer_message(deferred)
    stale_msg = stale_receiver.receive_messages(1)[0]
    stale_session = client.get_queue_receiver("old-sq", session_id="s1", max_wait_time=2)
    stale_session.receive_messages(1)
    for name, options in (("old", {}), ("old-sq", {"requires_session": True})):
        admin.delete_queue(name)
        admin.create_queue(name, **options)
    with client.get_queue_sender("old") as sender:
        sender.send_messages([ServiceBusMessage("new 1"), ServiceBusMessage("new 2")])
    with client.get_queue_sender("old-sq") as sender:
        sender.send_messages(ServiceBusMessage("new in session", session_id="s1"))
    return dict(stale_receiver=stale_receiver, stale_msg=stale_msg, stale_deferred=deferred.sequence_number,
                stale_session=stale_session)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The namespace the table describes, and the names its calls use."""
    base = tmp_path_factory.mktemp("invalid")
    ns = str(base / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q")
    admin.create_queue("sq", requires_session=True)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    admin.create_rule("t", "s", "r1", filter=SqlRuleFilter("color = @c", parameters={"@c": "red"}))
    client = sparkbus.ServiceBusClient(ns)
    sender = client.get_queue_sender("q")
    sender.send_messages([ServiceBusMessage("deferred"), ServiceBusMessage("locked")])
    receiver = client.get_queue_receiver("q", max_wait_time=2)
    first = receiver.receive_messages(1)[0]
    receiver.defer_message(first)
    msg = receiver.receive_messages(1)[0]
    closed_sender, closed_receiver = client.get_queue_sender("q"), client.get_queue_receiver("q")
    closed_sender.close()
    closed_receiver.close()
    emptied_rule, unprefixed_rule = admin.get_rule("t", "s", "r1"), admin.get_rule("t", "s", "r1")
    emptied_rule.filter.sql_expression = ""
    unprefixed_rule.filter.parameters = {"c": "red"}
    stale = stale_handles(admin, client)
    other_ns = str(base / "other")
    sparkbus.create_namespace(other_ns, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(other_ns).create_queue("q")
    other_sender = sparkbus.ServiceBusClient(other_ns).get_queue_sender("q")
    txn_block = client.transaction()  # kept open (a collected block would end it), never committed
    txn = txn_block.__enter__()
    a_file = str(base / "a-file")
    with open(a_file, "w") as handle:
        handle.write("not a directory")
    names = dict(sparkbus=sparkbus, ServiceBusMessage=ServiceBusMessage, SqlRuleFilter=SqlRuleFilter,
                 apply_definition=apply_definition, pandas=pandas, datetime=datetime, timedelta=timedelta,
                 timezone=timezone, ns=ns,
                 admin=admin, client=client, sender=sender, receiver=receiver,
                 sub_receiver=client.get_subscription_receiver("t", "s"), closed_sender=closed_sender,
                 closed_receiver=closed_receiver, msg=msg, deferred_seq=first.sequence_number,
                 emptied_rule=emptied_rule, unprefixed_rule=unprefixed_rule, a_file=a_file,
                 other_sender=other_sender, txn=txn, txn_block=txn_block, **stale)
    cwd = os.getcwd()
    os.chdir(base)  # a relative namespace location would land here
    yield str(base), names
    os.chdir(cwd)


@pytest.mark.parametrize("call,error,says", CALLS, ids=[c[0][:60] for c in CALLS])
def test_an_invalid_input_gets_its_error_and_writes_nothing(world, call, error, says):
    base, names = world
    assert maintenance.wait_idle(60)  # background compaction after the fixture's commits has finished
    before = files_under(base)
    with pytest.raises(Exception) as raised:
        eval(call, {}, dict(names))
    assert type(raised.value).__name__ == error or error in [c.__name__ for c in type(raised.value).__mro__], \
        f"{call}: expected {error}, got {type(raised.value).__name__}: {raised.value}"
    assert says in str(raised.value), f"{call}: the message {str(raised.value)!r} does not say {says!r}"
    assert files_under(base) == before, f"{call} wrote to the namespace"


def test_the_table_covers_every_public_handler_and_the_state_it_refers_to_still_works(world):
    """The fixture's locked message and deferred message are intact after all the refused calls: the
    rule still lists, the deferred message is still deferred (not locked by a failed call), and the
    locked one completes through its own receiver."""
    base, names = world
    admin, receiver = names["admin"], names["receiver"]
    before = files_under(base)
    admin.update_queue(admin.get_queue("q"))  # an update that changes nothing writes nothing either
    assert files_under(base) == before
    assert [r.name for r in admin.list_rules("t", "s")] == ["$Default", "r1"]
    assert admin.get_rule("t", "s", "r1").filter.parameters == {"@c": "red"}
    again = receiver.receive_deferred_messages([names["deferred_seq"]])
    assert again[0].delivery_count == 2  # the fixture's receive, and this one: the refused call took no lock
    receiver.complete_message(names["msg"])
    receiver.complete_message(again[0])
    covered = {call.split(".")[0].split("(")[0] for call, _, _ in CALLS}
    assert {"admin", "client", "sender", "receiver", "sparkbus", "apply_definition"} <= covered


def test_the_cli_answers_a_missing_file_and_a_bad_namespace_in_one_line(tmp_path):
    for args in (["apply", str(tmp_path / "missing.toml"), "--namespace", str(tmp_path / "ns")],
                 ["show", "--namespace", str(tmp_path / "none")]):
        done = subprocess.run([sys.executable, "-m", "sparkbus.cli", *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1 and done.stderr.startswith("sparkbus: ") and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not os.path.exists(tmp_path / "ns") and not os.path.exists(tmp_path / "none")


def test_a_bad_stored_rule_is_listed_and_can_be_repaired(tmp_path):
    """A rule row that no longer passes the checks (an empty expression, as an older version could store)
    never makes the management plane unusable: it is listed as stored, and update_rule replaces it."""
    from sparkbus.engine.catalog import Catalog, Change

    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    admin.create_rule("t", "s", "r", filter=SqlRuleFilter("n = 1"))
    catalog = Catalog(ns)
    row = next(r for r in catalog.snapshot().of_kind("rule") if r.path.endswith("/r"))
    emptied = dict(row.properties, filter=row.properties["filter"].replace('"n = 1"', '""'))
    catalog.transact(lambda snap: Change(upserts=[row.updated(emptied)]))
    assert [r.filter.sql_expression for r in admin.list_rules("t", "s")] == ["1=1", ""]
    assert admin.get_rule("t", "s", "r").filter.sql_expression == ""
    admin.create_rule("t", "s", "other", filter=SqlRuleFilter("n = 2"))  # the topic's other rules still work
    admin.update_rule("t", "s", "r", filter=SqlRuleFilter("n = 3"))
    assert admin.get_rule("t", "s", "r").filter == SqlRuleFilter("n = 3")
