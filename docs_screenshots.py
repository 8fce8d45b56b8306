"""The Explorer's screenshots in the documentation site (docs/assets/explorer-*.png), taken by `make docs`
with the headless Chromium the tests drive: a namespace made up here (orders with a dead-lettered message,
a topic with two subscriptions and a rule, a session queue), the Explorer serving it on a free loopback
port, and one picture each of the dashboard, an entity page and a dead-lettered message's page."""
from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, SqlRuleFilter
from sparkbus.explorer import serve

ASSETS = pathlib.Path(__file__).resolve().parent / "docs" / "assets"
PAGES = {"explorer-dashboard.png": "", "explorer-entity.png": "entities/orders",
         "explorer-message.png": "message/orders?queue=dead-letter&seq=1"}


def namespace(path: str) -> None:
    sparkbus.create_namespace(path, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(path)
    admin.create_queue("orders", max_delivery_count=5)
    admin.create_queue("carts", requires_session=True)
    admin.create_topic("events")
    admin.create_subscription("events", "audit")
    admin.create_subscription("events", "eu")
    admin.create_rule("events", "eu", "region", filter=SqlRuleFilter("region = 'eu'"))
    with ServiceBusClient(path) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f'{{"order": {n}, "customer": {n % 7}, "total": {12.5 * n}}}',
                                                    content_type="application/json", subject="order",
                                                    application_properties={"region": "eu" if n % 2 else "us"})
                                  for n in range(40)])
            sender.schedule_messages(ServiceBusMessage('{"order": 99}'), datetime.now(timezone.utc) + timedelta(hours=2))
        with client.get_queue_receiver("orders") as receiver:
            [first] = receiver.receive_messages(1, max_wait_time=5)
            receiver.dead_letter_message(first, reason="ValidationFailed", error_description="customer 0 is unknown")
            deferred = receiver.receive_messages(3, max_wait_time=5)
            for message in deferred:
                receiver.defer_message(message)
        client.get_queue_sender("carts").send_messages([ServiceBusMessage("item", session_id=f"cart-{n % 3}")
                                                        for n in range(9)])
        client.get_topic_sender("events").send_messages([ServiceBusMessage("e") for _ in range(5)])


def main() -> None:
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
                     "--hide-scrollbars"):
        options.add_argument(argument)
    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        sys.exit("chromedriver is not installed: run `make install` (Debian's chromium and chromium-driver)")
    with tempfile.TemporaryDirectory() as top:
        os.chdir(top)
        path = ".sparkbus/demo"  # (as `make demo` names it: the header shows the namespace)
        namespace(path)
        explorer = serve(path, port=0, block=False, allow_changes=True)
        browser = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            for name, page in PAGES.items():
                browser.get(explorer.url + page)
                time.sleep(0.5)  # the charts (images) loaded
                browser.save_screenshot(str(ASSETS / name))
                print(f"wrote {ASSETS / name}")
        finally:
            browser.quit()
            explorer.stop()


if __name__ == "__main__":
    main()
