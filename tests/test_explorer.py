"""The Explorer over HTTP: a real server (uvicorn on a loopback port) and a real namespace, asked as a
browser or a script asks. What its pages and JSON API show, every change its forms make (and what they
refuse, with nothing written), and the security rules: the token off loopback, the Host check, changes
only with allow_changes and the anti-forgery token, names from URLs checked. tests/test_explorer_browser.py
drives the same pages in Chromium."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.explorer import serve
from sparkbus.explorer.security import CSRF_FIELD, TOKEN_COOKIE


def _session(url: str) -> httpx.Client:
    """A client of the Explorer at url; its csrf attribute: the anti-forgery token of the dashboard's form
    (None when the Explorer shows no forms: read-only)."""
    web = httpx.Client(base_url=url.split("?")[0], follow_redirects=False, timeout=30)
    page = web.get("/")
    assert page.status_code == 200
    found = re.search(rf'name="{CSRF_FIELD}" value="([^"]+)"', page.text)
    web.csrf = found[1] if found else None
    return web


def _post(web: httpx.Client, route: str, **fields) -> httpx.Response:
    return web.post(f"/actions/{route}", data={CSRF_FIELD: web.csrf or "read-only: no form to read it from", **fields})


def _filled(admin, ns_path: str) -> None:
    """orders: 2 active (one deferred), 1 scheduled, 1 dead-lettered; events with two subscriptions."""
    admin.create_queue("orders", max_delivery_count=3)
    admin.create_topic("events")
    admin.create_subscription("events", "all")
    admin.create_subscription("events", "eu")
    with ServiceBusClient(ns_path) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f"order {n}", subject="order") for n in range(3)])
            sender.schedule_messages(ServiceBusMessage("later"), datetime.now(timezone.utc) + timedelta(hours=1))
        with client.get_queue_receiver("orders") as receiver:
            first, second = receiver.receive_messages(2, max_wait_time=5)
            receiver.dead_letter_message(first, reason="bad order", error_description="no customer")
            receiver.defer_message(second)
        client.get_topic_sender("events").send_messages(ServiceBusMessage("e"))


def _row(board: dict, path: str) -> dict:
    [row] = [r for r in board["entities"] if r["path"] == path]
    return row


def test_the_dashboard_counts_every_entity(admin, ns_path, explorer):
    _filled(admin, ns_path)
    web = _session(explorer().url)
    board = web.get("/api/namespace").json()
    assert [r["path"] for r in board["entities"]] == ["orders", "events", "events/Subscriptions/all",
                                                      "events/Subscriptions/eu"]
    orders = _row(board, "orders")
    assert (orders["active"], orders["deferred"], orders["scheduled"], orders["dead_letter"]) == (2, 1, 1, 1)
    assert orders["max_size_in_bytes"] == 1024 * 1024 * 1024 and orders["size_in_bytes"] > 0
    assert _row(board, "events")["awaiting_fanout"] == 1
    assert board["namespace"]["tier"] == "standard" and board["namespace"]["incoming_messages"] >= 5
    page = web.get("/").text
    assert 'data-path="events/Subscriptions/eu"' in page and '<a href="/entities/orders">orders</a>' in page


def test_an_entity_page_shows_settings_rules_sessions_and_charts(admin, ns_path, explorer):
    admin.create_queue("carts", requires_session=True)
    admin.create_topic("events")
    admin.create_subscription("events", "eu")
    admin.create_rule("events", "eu", "region", filter=sparkbus_sql("region = 'eu'"))
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("carts").send_messages([ServiceBusMessage("x", session_id=s) for s in "aab"])
    web = _session(explorer().url)
    carts = web.get("/api/entities/carts").json()
    assert carts["settings"]["requires_session"] is True and carts["settings"]["lock_duration"] == "PT1M"
    assert [(s["session_id"], s["message_count"]) for s in carts["sessions"]] == [("a", 2), ("b", 1)]
    assert carts["partitions"] == {"0": 3}
    rules = web.get("/api/entities/events/Subscriptions/eu").json()["rules"]
    assert [(r["name"], r["filter"]) for r in rules] == [("$Default", "TRUE"), ("region", "region = 'eu'")]
    chart = web.get("/charts/throughput.svg", params={"entity": "carts"})
    assert chart.headers["content-type"] == "image/svg+xml" and chart.text.lstrip().startswith("<?xml")
    assert "<svg" in web.get("/charts/partitions.svg", params={"entity": "carts"}).text
    assert web.get("/charts/other.svg", params={"entity": "carts"}).status_code == 404


def sparkbus_sql(expression: str):
    from sparkbus import SqlRuleFilter
    return SqlRuleFilter(expression)


def test_messages_page_by_sequence_number_and_by_state(admin, ns_path, explorer):
    _filled(admin, ns_path)
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("orders").send_messages([ServiceBusMessage(f"more {n}") for n in range(30)])
    web = _session(explorer().url)
    first = web.get("/api/messages/orders", params={"queue": "active", "count": 25}).json()
    assert len(first["messages"]) == 25 and {m["state"] for m in first["messages"]} == {"active"}
    second = web.get("/api/messages/orders", params={"queue": "active", "from": first["next_from"]}).json()
    numbers = [m["sequence_number"] for m in first["messages"] + second["messages"]]
    assert len(numbers) == 31 == len(set(numbers)) and numbers == sorted(numbers)  # all active ones, once
    assert second["next_from"] is None
    deferred = web.get("/api/messages/orders", params={"queue": "deferred"}).json()["messages"]
    assert [(m["state"], m["body"]["text"]) for m in deferred] == [("deferred", "order 1")]
    scheduled = web.get("/api/messages/orders", params={"queue": "scheduled"}).json()["messages"]
    assert [m["body"]["text"] for m in scheduled] == ["later"]
    [dead] = web.get("/api/messages/orders", params={"queue": "dead-letter"}).json()["messages"]
    assert (dead["state"], dead["dead_letter_reason"], dead["dead_letter_error_description"]) == \
        ("dead-lettered", "bad order", "no customer")
    one = web.get("/api/message/orders", params={"queue": "dead-letter", "seq": dead["sequence_number"]}).json()
    assert one["body"] == {"kind": "text", "text": "order 0", "size": 7, "cut": False, "source": "order 0"}
    assert web.get("/api/message/orders", params={"queue": "active", "seq": dead["sequence_number"]}).status_code == 404
    for bad in ({"queue": "poison"}, {"from": "-1"}, {"count": "0"}, {"count": "x"}):
        answer = web.get("/api/messages/orders", params=bad)
        assert answer.status_code == 400 and answer.json()["error"] == "ValueError", bad


def test_bodies_show_as_json_text_or_hex_and_markup_stays_text(admin, ns_path, explorer):
    admin.create_queue("q")
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("q").send_messages([
            ServiceBusMessage('{"id": 7, "items": ["a"]}', application_properties={"<b>k</b>": "<i>v</i>", "n": 5}),
            ServiceBusMessage("<script>alert(1)</script>"), ServiceBusMessage(b"\xff\x00\x01")])
    web = _session(explorer().url)
    kinds = [(m["body"]["kind"], m["body"]["text"]) for m in web.get("/api/messages/q").json()["messages"]]
    assert kinds == [("json", '{\n  "id": 7,\n  "items": [\n    "a"\n  ]\n}'), ("text", "<script>alert(1)</script>"),
                     ("hex", "ff 00 01")]
    listing = web.get("/messages/q").text
    page = web.get("/message/q", params={"queue": "active", "seq": 2}).text
    for shown in (listing, page):
        assert "<script>alert" not in shown and "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
    first = web.get("/message/q", params={"queue": "active", "seq": 1}).text
    assert "&lt;b&gt;k&lt;/b&gt;" in first and "<b>k</b>" not in first and "<i>v</i>" not in first
    headers = web.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"


def test_without_allow_changes_there_are_no_controls_and_a_forged_post_writes_nothing(admin, ns_path, explorer):
    _filled(admin, ns_path)
    web = _session(explorer().url)
    for path in ("/", "/entities/orders", "/messages/orders?queue=dead-letter", "/message/orders?queue=active&seq=2"):
        page = web.get(path).text
        assert "/actions/" not in page and "<form method=\"post\"" not in page, path
    for action, fields in (("purge", {"entity": "orders", "queue": "active", "confirm": "orders"}),
                           ("delete", {"entity": "orders", "confirm": "orders"}),
                           ("send", {"entity": "orders", "body": "x"})):
        answer = _post(web, action, **fields)
        assert answer.status_code == 403 and "without --allow-changes" in answer.text
    assert admin.get_queue_runtime_properties("orders").total_message_count == 4


def test_a_change_needs_the_pages_anti_forgery_token_and_origin(admin, ns_path, explorer):
    _filled(admin, ns_path)
    web = _session(explorer(allow_changes=True).url)
    fields = {"entity": "orders", "queue": "active", "confirm": "orders"}
    assert web.post("/actions/purge", data=fields).status_code == 403  # no token in the form
    assert web.post("/actions/purge", data={**fields, CSRF_FIELD: "x" * 32}).status_code == 403  # not the page's
    forged = web.post("/actions/purge", data={**fields, CSRF_FIELD: web.csrf},
                      headers={"Origin": "http://evil.example"})
    assert forged.status_code == 403 and "nothing was changed" in forged.text
    assert admin.get_queue_runtime_properties("orders").active_message_count == 2
    assert _post(web, "purge", **fields).status_code == 303
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.deferred_message_count) == (1, 1)  # as purge_messages: deferred stay


def test_only_loopback_hosts_are_served_without_a_token(admin, ns_path, explorer):
    url = explorer().url
    assert httpx.get(url).status_code == 200
    refused = httpx.get(url, headers={"Host": "attacker.example:8642"})
    assert refused.status_code == 403 and "localhost / 127.0.0.1 only" in refused.text


def test_any_other_address_requires_the_token(admin, ns_path):
    started = serve(ns_path, host="127.0.0.2", port=0, block=False)
    try:
        base, token = started.url.split("?token=")
        assert base.startswith("http://127.0.0.2:") and len(token) >= 32
        for answer in (httpx.get(base), httpx.get(base + "api/namespace"), httpx.get(base + "?token=wrong"),
                       httpx.get(base, headers={"Authorization": "token wrong"})):
            assert answer.status_code == 403 and "access token" in answer.text
            assert admin.list_queues() == [] and "tier" not in answer.text
        first = httpx.get(started.url)
        assert first.status_code == 303 and first.headers["location"] == "/"  # the token leaves the URL
        assert f"{TOKEN_COOKIE}={token}" in first.headers["set-cookie"] and "HttpOnly" in first.headers["set-cookie"]
        assert httpx.get(base, cookies={TOKEN_COOKIE: token}).status_code == 200
        assert httpx.get(base + "api/namespace", headers={"Authorization": f"token {token}"}).status_code == 200
    finally:
        started.stop()


def test_send_settle_and_cancel_from_the_forms(admin, ns_path, explorer):
    _filled(admin, ns_path)
    web = _session(explorer(allow_changes=True).url)
    sent = _post(web, "send", entity="orders", body="hello", application_properties='{"region": "eu", "n": 3}',
                 subject="greeting", repeat="3")
    assert sent.status_code == 303 and "sent+3+message" in sent.headers["location"]
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("orders") as receiver:
        hello = [m for m in receiver.peek_messages(50) if str(m) == "hello"]
    assert len(hello) == 3 and hello[0].application_properties == {b"region": b"eu", b"n": 3}  # (the SDK's bytes)
    assert hello[0].subject == "greeting" and len({m.message_id for m in hello}) == 3
    number = hello[0].sequence_number
    assert _post(web, "settle", entity="orders", queue="active", seq=str(number), action="defer").status_code == 303
    deferred = web.get("/api/messages/orders", params={"queue": "deferred"}).json()["messages"]
    assert number in [m["sequence_number"] for m in deferred]
    assert _post(web, "settle", entity="orders", queue="deferred", seq=str(number), action="dead-letter",
                 reason="checked by hand", description="from the Explorer").status_code == 303
    dead = web.get("/api/message/orders", params={"queue": "dead-letter", "seq": number}).json()
    assert (dead["dead_letter_reason"], dead["dead_letter_error_description"]) == ("checked by hand", "from the Explorer")
    assert _post(web, "settle", entity="orders", queue="dead-letter", seq=str(number), action="complete").status_code == 303
    assert web.get("/api/message/orders", params={"queue": "dead-letter", "seq": number}).status_code == 404
    [later] = web.get("/api/messages/orders", params={"queue": "scheduled"}).json()["messages"]
    assert _post(web, "settle", entity="orders", queue="scheduled", seq=str(later["sequence_number"]),
                 action="cancel").status_code == 303
    assert admin.get_queue_runtime_properties("orders").scheduled_message_count == 0
    refused = _post(web, "settle", entity="orders", queue="scheduled", seq=str(later["sequence_number"]), action="complete")
    assert refused.status_code == 400 and "can be cancel" in refused.text
    gone = _post(web, "settle", entity="orders", queue="active", seq="999", action="complete")
    assert gone.status_code == 404


def test_a_session_message_is_settled_through_its_session(admin, ns_path, explorer):
    admin.create_queue("carts", requires_session=True)
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("carts").send_messages([ServiceBusMessage("a1", session_id="a"),
                                                        ServiceBusMessage("b1", session_id="b")])
    web = _session(explorer(allow_changes=True).url)
    assert _post(web, "settle", entity="carts", queue="active", seq="2", action="complete").status_code == 303
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("carts") as receiver:
        assert [str(m) for m in receiver.peek_messages(10)] == ["a1"]


def test_resubmit_one_edited_selected_or_all(admin, ns_path, explorer):
    admin.create_queue("orders")
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("orders").send_messages([ServiceBusMessage(f"o{n}", message_id=f"m{n}") for n in range(5)])
        with client.get_queue_receiver("orders") as receiver:
            for message in receiver.receive_messages(5, max_wait_time=5):
                receiver.dead_letter_message(message, reason="bad")
    web = _session(explorer(allow_changes=True).url)
    bad_edit = _post(web, "resubmit", entity="orders", seq="1", edited="yes", body="x", application_properties="[1]")
    assert bad_edit.status_code == 400 and "must be a JSON object" in bad_edit.text
    assert admin.get_queue_runtime_properties("orders").dead_letter_message_count == 5  # nothing moved
    assert _post(web, "resubmit", entity="orders", seq="1", edited="yes", body="o0 fixed",
                 application_properties='{"fixed": true}').status_code == 303
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("orders") as receiver:
        [fixed] = receiver.receive_messages(5, max_wait_time=5)
        assert (str(fixed), fixed.message_id, fixed.application_properties) == ("o0 fixed", "m0", {b"fixed": True})
        receiver.complete_message(fixed)
    answer = web.post("/actions/resubmit", data={CSRF_FIELD: web.csrf, "entity": "orders",
                                                 "seq": ["2", "3"]})
    assert answer.status_code == 303 and "resubmitted+2" in answer.headers["location"]
    assert _post(web, "resubmit", entity="orders", all="yes").status_code == 303
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (4, 0)
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("orders") as receiver:
        assert sorted(str(m) for m in receiver.peek_messages(10)) == ["o1", "o2", "o3", "o4"]  # each once
    nothing = _post(web, "resubmit", entity="orders")
    assert nothing.status_code == 400 and "choose the dead-lettered messages" in nothing.text


def test_purge_asks_for_the_name(admin, ns_path, explorer):
    _filled(admin, ns_path)
    web = _session(explorer(allow_changes=True).url)
    wrong = _post(web, "purge", entity="orders", queue="dead-letter", confirm="order")
    assert wrong.status_code == 400 and "type the entity's name, orders, to confirm" in html.unescape(wrong.text)
    assert admin.get_queue_runtime_properties("orders").dead_letter_message_count == 1
    assert _post(web, "purge", entity="orders", queue="dead-letter", confirm="orders").status_code == 303
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.dead_letter_message_count, runtime.active_message_count) == (0, 2)  # the active ones stay


def test_entities_and_rules_are_created_updated_and_deleted(admin, ns_path, explorer):
    web = _session(explorer(allow_changes=True).url)
    made = _post(web, "create", kind="queue", name="jobs", settings="lock_duration=PT30S\nmax_delivery_count=4\n")
    assert made.status_code == 303 and made.headers["location"].startswith("/entities/jobs?done=created")
    assert (admin.get_queue("jobs").lock_duration, admin.get_queue("jobs").max_delivery_count) == (timedelta(seconds=30), 4)
    bad = _post(web, "create", kind="queue", name="other", settings="lock_duration=soon")
    assert bad.status_code == 400 and "lock_duration takes seconds" in bad.text
    assert _post(web, "create", kind="queue", name="bad name!").status_code == 400
    assert [q.name for q in admin.list_queues()] == ["jobs"]
    assert _post(web, "update", entity="jobs", settings="max_delivery_count=9").status_code == 303
    assert admin.get_queue("jobs").max_delivery_count == 9
    assert _post(web, "update", entity="jobs", settings="archive_retention=P7D").status_code == 303
    assert admin.get_queue("jobs").archive_retention == timedelta(days=7)
    jobs = web.get("/api/entities/jobs").json()
    assert jobs["settings"]["archive_retention"] == "P7D"
    assert (jobs["row"]["archive_retention"], jobs["row"]["archive_messages"]) == ("P7D", 0)
    assert "archive: 0 message(s) kept P7D" in web.get("/entities/jobs").text
    assert _post(web, "update", entity="jobs", settings="archive_retention=P91D").status_code == 400
    assert _post(web, "create", kind="topic", name="events").status_code == 303
    assert _post(web, "create", kind="subscription", name="eu", topic="events").status_code == 303
    assert _post(web, "create-rule", entity="events/Subscriptions/eu", name="eu", sql="region = 'eu'").status_code == 303
    assert _post(web, "create-rule", entity="events/Subscriptions/eu", name="c",
                 correlation='{"correlation_id": "5", "region": "eu"}').status_code == 303
    rule = admin.get_rule("events", "eu", "c")
    assert (rule.filter.correlation_id, rule.filter.properties) == ("5", {"region": "eu"})
    assert _post(web, "create-rule", entity="events/Subscriptions/eu", name="x", sql="a ==").status_code == 400
    assert _post(web, "delete-rule", entity="events/Subscriptions/eu", name="eu").status_code == 303
    assert [r.name for r in admin.list_rules("events", "eu")] == ["$Default", "c"]
    assert _post(web, "delete", entity="jobs", confirm="job").status_code == 400
    assert _post(web, "delete", entity="jobs", confirm="jobs").status_code == 303
    assert [q.name for q in admin.list_queues()] == []


@pytest.mark.parametrize("path", ["/entities/..%2F..%2Fetc", "/api/entities/a%00b", "/api/messages/x/../../y",
                                  "/entities/t/Subscriptions/..", "/message/q%2F..%2F..?queue=active&seq=1"])
def test_names_from_urls_are_checked_before_anything_is_read(admin, ns_path, explorer, path):
    answer = httpx.get(explorer().url.rstrip("/") + path)
    assert answer.status_code in (400, 404), path
    assert "invalid" in answer.text or "does not exist" in answer.text or "Not Found" in answer.text


def test_the_notebook_view_is_the_dashboard_escaped(admin, ns_path, explorer):
    _filled(admin, ns_path)
    started = explorer()
    shown = started._repr_html_()
    assert "sparkbus Explorer" in shown and started.url in shown
    assert re.search(r">orders</a></td>\s*<td[^>]*>queue</td><td[^>]*>Active</td>\s*<td[^>]*>2</td>", shown)


def test_sparkbus_ui_prints_the_url_with_its_token_and_serves_it(admin, ns_path):
    admin.create_queue("orders")
    ui = subprocess.Popen([sys.executable, "-m", "sparkbus.cli", "ui", "--namespace", ns_path, "--host", "127.0.0.2",
                           "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = ui.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.2:\d+/\?token=\S+) \(Ctrl-C stops\)", line)
        assert url and "(read-only)" in line, line
        base = url[1].split("?")[0]
        assert httpx.get(base).status_code == 403
        with httpx.Client(follow_redirects=True) as web:
            assert "orders" in web.get(url[1]).text
    finally:
        ui.terminate()
        assert ui.wait(timeout=30) == 0


def test_a_port_in_use_and_a_missing_namespace_are_errors_of_the_call(admin, ns_path, tmp_path, explorer):
    started = explorer()
    port = int(started.url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(OSError):
        serve(ns_path, port=port, block=False)
    from sparkbus.exceptions import MessagingEntityNotFoundError
    with pytest.raises(MessagingEntityNotFoundError):
        serve(str(tmp_path / "nothing"), port=0, block=False)
