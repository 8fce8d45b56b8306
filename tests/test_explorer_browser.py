"""The Explorer in a real browser: headless Chromium (Debian's, installed by `make install`) driven by
Selenium, against the Explorer serving a namespace on local disk and on Azurite. What a user sees and
clicks: the dashboard's counts, filter and refresh; a dead-lettered message found, edited and resubmitted
(it arrives once); purge asking for the name; a `<script>` body shown as text; a read-only Explorer with no
controls, where a forged cross-site POST writes nothing; the token off loopback."""
from __future__ import annotations

import http.server
import shutil
import threading
from datetime import datetime, timedelta, timezone

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from sparkbus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from sparkbus.explorer import serve

pytestmark = [pytest.mark.slow,
              pytest.mark.parametrize("store", ["local", "azurite"], indirect=True)]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (a fresh profile: no cookies carried between modules)."""
    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.fail("chromedriver is not installed: run `make install` (Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(autouse=True)
def _cookies_cleared(browser):
    """No test sees another's cookies (an access token of an Explorer that stopped)."""
    yield
    browser.delete_all_cookies()


def _filled(admin, ns_path: str) -> None:
    """orders: 3 active, 1 scheduled, 1 dead-lettered (reason 'bad order'); events with subscriptions all and eu."""
    admin.create_queue("orders")
    admin.create_topic("events")
    admin.create_subscription("events", "all")
    admin.create_subscription("events", "eu")
    with ServiceBusClient(ns_path) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f"order {n}") for n in range(4)])
            sender.schedule_messages(ServiceBusMessage("later"), datetime.now(timezone.utc) + timedelta(hours=1))
        with client.get_queue_receiver("orders") as receiver:
            [first] = receiver.receive_messages(1, max_wait_time=5)
            receiver.dead_letter_message(first, reason="bad order", error_description="customer 17 is unknown")
        client.get_topic_sender("events").send_messages(ServiceBusMessage("e"))


def _cell(browser, path: str, column: str) -> str:
    """A cell of the dashboard's table, read again when the page's refresh replaced it while it was read."""
    for _ in range(20):
        try:
            return browser.find_element(By.CSS_SELECTOR, f'tr[data-path="{path}"] td[data-col="{column}"]').text
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"the cell {path}/{column} kept being replaced")


def _wait(browser, condition, timeout: float = 30):
    return WebDriverWait(browser, timeout, poll_frequency=0.2).until(lambda _: condition())


def _landed(browser, element_id: str) -> str:
    """The text of the element a form's answer page shows (its id: done or error), waited for: a click on a
    submit button returns before the browser has followed the POST and its redirect."""
    return _wait(browser, lambda: next(iter(browser.find_elements(By.ID, element_id)), None)).text


def test_the_dashboard_shows_the_counts_filters_and_refreshes(admin, ns_path, explorer, browser):
    _filled(admin, ns_path)
    browser.get(explorer().url)
    rows = [r.get_attribute("data-path") for r in browser.find_elements(By.CSS_SELECTOR, "#entities tbody tr")]
    assert rows == ["orders", "events", "events/Subscriptions/all", "events/Subscriptions/eu"]
    assert [_cell(browser, "orders", c) for c in ("active", "scheduled", "dead_letter")] == ["3", "1", "1"]
    assert _cell(browser, "events", "awaiting_fanout") == "1"
    assert browser.find_element(By.ID, "mode").text == "read-only"
    browser.find_element(By.ID, "filter").send_keys("eu")
    shown = [r.get_attribute("data-path") for r in browser.find_elements(By.CSS_SELECTOR, "#entities tbody tr")
             if r.is_displayed()]
    assert shown == ["events/Subscriptions/eu"]
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("orders").send_messages([ServiceBusMessage("x"), ServiceBusMessage("y")])
    browser.find_element(By.ID, "filter").clear()
    browser.find_element(By.ID, "filter").send_keys("orders")
    _wait(browser, lambda: _cell(browser, "orders", "active") == "5")  # the refresh, within a few seconds
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-path="orders"]').is_displayed()
    assert not browser.find_element(By.CSS_SELECTOR, 'tr[data-path="events"]').is_displayed()  # filter kept


def test_a_dead_lettered_message_is_found_edited_and_resubmitted_once(admin, ns_path, explorer, browser):
    _filled(admin, ns_path)
    browser.get(explorer(allow_changes=True).url)
    browser.find_element(By.LINK_TEXT, "orders").click()
    browser.find_element(By.CSS_SELECTOR, '#lists a[data-queue="dead-letter"]').click()
    assert "bad order" in browser.find_element(By.ID, "messages").text
    browser.find_element(By.CSS_SELECTOR, "#messages tbody tr td.n a").click()
    assert browser.find_element(By.ID, "reason").text == "bad order"
    assert browser.find_element(By.ID, "description").text == "customer 17 is unknown"
    assert browser.find_element(By.ID, "body").text == "order 0"
    browser.find_element(By.ID, "edited").click()
    body = browser.find_element(By.ID, "edit-body")
    body.clear()
    body.send_keys("order 0 (customer fixed)")
    browser.find_element(By.ID, "edit-properties").send_keys('{"customer": 18}')
    browser.find_element(By.ID, "resubmit-button").click()
    assert _landed(browser, "done") == "resubmitted 1 message(s)"
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (4, 0)
    with ServiceBusClient(ns_path) as client, client.get_queue_receiver("orders") as receiver:
        got = receiver.receive_messages(10, max_wait_time=5)
        fixed = [m for m in got if str(m).startswith("order 0")]
        assert [(str(m), m.application_properties) for m in fixed] == [("order 0 (customer fixed)", {b"customer": 18})]
        receiver.complete_messages(got)


def test_purge_asks_for_the_entitys_name(admin, ns_path, explorer, browser):
    _filled(admin, ns_path)
    browser.get(explorer(allow_changes=True).url.rstrip("/") + "/entities/orders")
    purge = browser.find_elements(By.CSS_SELECTOR, "details.purge")[0]
    purge.find_element(By.TAG_NAME, "summary").click()
    purge.find_element(By.NAME, "confirm").send_keys("order")
    purge.find_element(By.CSS_SELECTOR, "button.danger").click()
    assert "type the entity's name, orders, to confirm" in _landed(browser, "error")
    assert admin.get_queue_runtime_properties("orders").active_message_count == 3
    browser.back()
    purge = browser.find_elements(By.CSS_SELECTOR, "details.purge")[0]
    if not purge.get_attribute("open"):
        purge.find_element(By.TAG_NAME, "summary").click()
    confirm = purge.find_element(By.NAME, "confirm")
    confirm.clear()
    confirm.send_keys("orders")
    purge.find_element(By.CSS_SELECTOR, "button.danger").click()
    assert _landed(browser, "done") == "purged 3 message(s) from orders"
    runtime = admin.get_queue_runtime_properties("orders")
    assert (runtime.active_message_count, runtime.dead_letter_message_count, runtime.scheduled_message_count) == (0, 1, 1)


def test_a_script_body_shows_as_text(admin, ns_path, explorer, browser):
    admin.create_queue("q")
    script = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage(script, subject="<b>bold</b>",
                                                                     application_properties={"<i>": "<u>x</u>"}))
    base = explorer(allow_changes=True).url.rstrip("/")
    for page in ("/messages/q", "/message/q?queue=active&seq=1"):
        browser.get(base + page)
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text
        assert browser.execute_script("return document.querySelectorAll('main script, main img, main b').length") == 0
    assert browser.find_element(By.ID, "body").text == script
    assert "<b>bold</b>" in browser.find_element(By.ID, "properties").text
    assert "<i>" in browser.find_element(By.ID, "application-properties").text


class _Forger(http.server.BaseHTTPRequestHandler):
    """Another site: a page whose form posts to the Explorer by itself."""

    target = ""

    def do_GET(self):
        page = (f'<form id="f" method="post" action="{self.target}/actions/purge">'
                '<input name="entity" value="orders"><input name="queue" value="active">'
                '<input name="confirm" value="orders"><input name="csrf_token" value="guessed"></form>'
                '<script>document.getElementById("f").submit()</script>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("allow_changes", [False, True])
def test_a_forged_cross_site_post_writes_nothing(admin, ns_path, explorer, browser, allow_changes):
    _filled(admin, ns_path)
    url = explorer(allow_changes=allow_changes).url
    browser.get(url)  # the Explorer's cookies are in the browser, as for someone using it
    if not allow_changes:
        for page in ("", "entities/orders", "messages/orders?queue=dead-letter", "message/orders?queue=active&seq=2"):
            browser.get(url + page)
            assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == [], page
    _Forger.target = url.rstrip("/")
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forger)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{site.server_address[1]}/")
        _wait(browser, lambda: "/actions/purge" in browser.current_url)
        text = browser.find_element(By.TAG_NAME, "body").text
        assert ("without --allow-changes" if not allow_changes else "anti-forgery token") in text
    finally:
        site.shutdown()
    assert admin.get_queue_runtime_properties("orders").active_message_count == 3


def test_off_loopback_the_browser_needs_the_token(admin, ns_path, browser):
    admin.create_queue("orders")
    started = serve(ns_path, host="127.0.0.2", port=0, block=False)
    try:
        base = started.url.split("?")[0]
        browser.get(base)
        assert "requires its access token" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(started.url)
        assert browser.current_url == base  # the token left the address bar
        browser.find_element(By.LINK_TEXT, "orders").click()
        assert browser.find_element(By.ID, "entity-name").text == "orders"
    finally:
        browser.delete_all_cookies()
        started.stop()


def test_a_deferred_message_is_received_by_its_number_and_completed(admin, ns_path, explorer, browser):
    admin.create_queue("jobs")
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("jobs").send_messages([ServiceBusMessage("j1"), ServiceBusMessage("j2")])
        with client.get_queue_receiver("jobs") as receiver:
            [first] = receiver.receive_messages(1, max_wait_time=5)
            receiver.defer_message(first)
    browser.get(explorer(allow_changes=True).url.rstrip("/") + "/messages/jobs?queue=deferred")
    browser.find_element(By.CSS_SELECTOR, "#messages tbody tr td.n a").click()
    browser.find_element(By.CSS_SELECTOR, 'button[data-action="complete"]').click()
    assert _landed(browser, "done") == "completed message 1"
    with ServiceBusClient(ns_path) as client, \
            client.get_queue_receiver("jobs", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead:
        assert dead.peek_messages(5) == []
    runtime = admin.get_queue_runtime_properties("jobs")
    assert (runtime.active_message_count, runtime.deferred_message_count) == (1, 0)
