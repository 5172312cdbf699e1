"""The web console in a real browser (headless Chromium driven by Selenium): log in, create a queue, publish, see
the count change, purge, see a rate chart draw with its scale, close a connection; what a user's tags do not allow is
not shown; the page asks for no missing file and keeps to the API's Content-Security-Policy. Screenshots go to
test-artifacts/console/."""

from __future__ import annotations

import json
import os
import re
import shutil

import pika
import pika.exceptions
import pytest

from tests.conftest import REPO_ROOT
from tests.integration.helpers import EVENT_TIMEOUT, connect
from tests.integration.management import add_user, request, set_permissions
from tests.mqtt.clients import connected
from tests.waiting import wait_for

webdriver = pytest.importorskip("selenium.webdriver", reason="the console tests need selenium (pip install selenium)")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException, StaleElementReferenceException, TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="the console tests need Chromium and its driver: apt-get install -y chromium chromium-driver")
ARTIFACTS = REPO_ROOT / "test-artifacts" / "console"
WAIT = 15  # seconds for anything the page shows after a refresh (the console reads the API every 5 s)


@pytest.fixture
def browser(short_temporary):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for browser_errors
    # Chromium leaves the directory of its singleton socket in its temporary directory when it quits: one of its own,
    # removed after it, rather than /tmp for good
    service = Service(DRIVER, env={**os.environ, "TMPDIR": str(short_temporary)})
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()


@pytest.fixture
def console_broker(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[management]\ncollect_statistics_interval = 250\n")
    return own_broker("--config", str(config))


def screenshot(driver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def log_in(driver, broker, username: str = "guest", password: str = "guest") -> None:
    driver.get(f"http://127.0.0.1:{broker.management_port}/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()


def wait(driver, condition, timeout: float = WAIT):
    """Until condition(driver) is true, trying again when the page was redrawn under it meanwhile; past timeout,
    a failure that shows what the page said then and what the browser logged."""
    try:
        return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,
                                                                  NoSuchElementException)).until(condition)
    except TimeoutException:
        shown = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"not seen within {timeout} s; the page showed:\n{shown}\n"
                             f"the browser logged: {browser_errors(driver)}") from None


def submit(driver, form_id: str, **fields: str) -> None:
    """Fill in a form of the page and submit it (again, if the page was redrawn in between)."""
    def fill_and_submit(d) -> bool:
        form = d.find_element(By.ID, form_id)
        for name, value in fields.items():
            field = form.find_element(By.NAME, name)
            field.clear()
            field.send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button").click()
        return True
    wait(driver, fill_and_submit)


def click(driver, by: str, value: str) -> None:
    wait(driver, lambda d: d.find_element(by, value).click() or True)


def text_of(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def browser_errors(driver) -> list[str]:
    """What the browser logged as errors since the last call: failed loads (a 404) and Content-Security-Policy
    violations among them."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def chart_scale(driver, selector: str = "svg.chart") -> tuple[list[str], list[str]]:
    """The labels of a rate chart's scale: messages/s up the side, times along the bottom."""
    chart = driver.find_element(By.CSS_SELECTOR, selector)
    return ([tick.text for tick in chart.find_elements(By.CSS_SELECTOR, ".y-axis text.tick")],
            [tick.text for tick in chart.find_elements(By.CSS_SELECTOR, ".x-axis text.tick")])


def test_create_a_queue_publish_see_the_count_purge_and_a_rate_chart(browser, console_broker, unique):
    log_in(browser, console_broker)
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=overview] .tiles"))
    screenshot(browser, "overview")

    click(browser, By.LINK_TEXT, "Queues")
    submit(browser, "add-queue", name=unique)
    wait(browser, lambda d: d.find_element(By.LINK_TEXT, unique))
    screenshot(browser, "queues")
    click(browser, By.LINK_TEXT, unique)

    for n in range(3):
        submit(browser, "publish-message", payload=f"hello {n}")
        wait(browser, lambda d, n=n: f"Ready {n + 1}" in text_of(d, "#queue-details"))
    with connect(console_broker) as conn:  # the count follows what clients do too
        conn.channel().basic_publish("", unique, b"from pika")
    wait(browser, lambda d: "Ready 4" in text_of(d, "#queue-details"))

    # the chart draws a publish rate above 0 once the broker has samples a chart interval (5 s) apart on both
    # sides of the publishes
    def publish_line_drawn(d) -> bool:
        line = d.find_element(By.CSS_SELECTOR, "svg.chart polyline[data-key=publish]")
        return int(line.get_attribute("data-count")) >= 2 and float(line.get_attribute("data-peak")) > 0
    wait(browser, publish_line_drawn, timeout=30)
    screenshot(browser, "queue")
    rates, times = wait(browser, chart_scale)  # (as drawn at one time: the page is redrawn every 5 s)
    assert len(rates) >= 3 and rates[0] == "0", rates
    assert len(times) >= 2 and all(re.fullmatch(r"\d\d:\d\d:\d\d", time) for time in times), times

    submit(browser, "get-messages")
    wait(browser, lambda d: text_of(d, "#queue-output") == f"{unique}: hello 0")

    click(browser, By.ID, "purge")
    wait(browser, lambda d: "Ready 0" in text_of(d, "#queue-details"))
    with connect(console_broker) as conn:
        assert conn.channel().queue_declare(unique, passive=True).method.message_count == 0

    click(browser, By.ID, "delete")
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=queues]"))
    assert not browser.find_elements(By.LINK_TEXT, unique)


def test_an_administrator_closes_a_connection_adds_a_user_and_sets_and_clears_its_topic_permission(browser, console_broker, unique):
    parameters = pika.URLParameters(console_broker.url)
    parameters.client_properties = {"connection_name": f"{unique}-orders"}  # (shown beside the connection's name)
    conn = pika.BlockingConnection(parameters)
    log_in(browser, console_broker)
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=overview]"))
    with connected(console_broker, f"{unique}-device"):  # an MQTT client is listed beside the AMQP one
        click(browser, By.LINK_TEXT, "Connections")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "button.close-connection")) == 2)
        listed = wait(browser, lambda d: text_of(d, "main"))  # (as drawn at one time)
        assert "AMQP 0-9-1" in listed and "MQTT 3.1.1" in listed and f"MQTT client {unique}-device" in listed
        assert f"({unique}-orders)" in listed
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "button.close-connection")) == 1)
    screenshot(browser, "connections")
    click(browser, By.CSS_SELECTOR, "button.close-connection")
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "button.close-connection"))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="Closed via management plugin"):
        conn.process_data_events(time_limit=EVENT_TIMEOUT)

    click(browser, By.LINK_TEXT, "Admin")
    submit(browser, "add-user", name=unique, password="s3cret", tags="monitoring")
    wait(browser, lambda d: unique in text_of(d, "#users"))
    submit(browser, "set-topic-permissions", user=unique, vhost="/", exchange="amq.topic", write="^sensors\\.",
           read=".*")
    wait(browser, lambda d: unique in text_of(d, "#topic-permissions"))
    held = f"/api/topic-permissions/%2F/{unique}"
    assert request(console_broker, "GET", held).body == [
        {"user": unique, "vhost": "/", "exchange": "amq.topic", "write": "^sensors\\.", "read": ".*"}]
    screenshot(browser, "admin")
    click(browser, By.XPATH, f"//*[@id='topic-permissions']//tr[contains(., '{unique}')]//button")
    wait(browser, lambda d: unique not in text_of(d, "#topic-permissions"))
    assert request(console_broker, "GET", held).status == 404


def test_an_administrator_adds_a_shovel_and_sees_it_run(browser, console_broker, unique):
    with connect(console_broker) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{unique}-from")
        channel.queue_declare(f"{unique}-to")
        channel.basic_publish("", f"{unique}-from", b"shovelled")
    log_in(browser, console_broker)
    click(browser, By.LINK_TEXT, "Admin")
    submit(browser, "add-shovel", vhost="/", name=unique, **{
        "src-uri": console_broker.url, "src-queue": f"{unique}-from", "dest-uri": "amqp://",
        "dest-queue": f"{unique}-to"})
    wait(browser, lambda d: unique in text_of(d, "#shovels"))
    with connect(console_broker) as conn:
        channel = conn.channel()
        wait_for(lambda: channel.queue_declare(f"{unique}-to", passive=True).method.message_count, 30,
                 "the message moved", until=lambda count: count == 1)
    click(browser, By.LINK_TEXT, "Overview")
    click(browser, By.LINK_TEXT, "Admin")  # (drawn again: the state as it is now)
    wait(browser, lambda d: "running" in text_of(d, "#shovels"))
    assert "guest" not in wait(browser, lambda d: text_of(d, "#shovels"))  # (no credentials shown)
    screenshot(browser, "shovels")


def test_an_administrator_adds_a_federation_upstream_and_sees_the_link_its_policy_makes(browser, console_broker,
                                                                                        unique):
    with connect(console_broker) as conn:
        conn.channel().exchange_declare(unique, "fanout")
    log_in(browser, console_broker)
    click(browser, By.LINK_TEXT, "Admin")
    submit(browser, "add-federation-upstream", vhost="/", name=unique, uri=console_broker.url)
    wait(browser, lambda d: unique in text_of(d, "#federation-upstreams"))
    submit(browser, "add-policy", vhost="/", name=unique, pattern=f"^{unique}$",
           definition=json.dumps({"federation-upstream": unique}))
    wait_for(lambda: [link["status"] for link in request(console_broker, "GET", "/api/federation-links").body
                      if link["exchange"] == unique], 30, "the link running", until=lambda states: states == ["running"])
    click(browser, By.LINK_TEXT, "Overview")
    click(browser, By.LINK_TEXT, "Admin")  # (drawn again: the links as they are now)
    wait(browser, lambda d: "running" in text_of(d, "#federation-links"))
    assert "guest" not in wait(browser, lambda d: text_of(d, "#federation-upstreams"))  # (no credentials shown)
    screenshot(browser, "federation")
    request(console_broker, "DELETE", f"/api/policies/%2F/{unique}")
    request(console_broker, "DELETE", f"/api/parameters/federation-upstream/%2F/{unique}")


def test_definitions_uploaded_through_the_console_are_imported(browser, console_broker, unique, tmp_path):
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({"queues": [{"name": unique, "vhost": "/", "durable": True,
                                                   "auto_delete": False, "arguments": {"x-max-length": 7}}]}))
    log_in(browser, console_broker)
    click(browser, By.LINK_TEXT, "Definitions")
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#upload-definitions input[type=file]")).send_keys(
        str(definitions))
    click(browser, By.CSS_SELECTOR, "#upload-definitions button")
    wait(browser, lambda d: text_of(d, "#status") == "Definitions imported")
    with connect(console_broker) as conn:
        conn.channel().queue_declare(unique, passive=True)  # it exists now
    click(browser, By.LINK_TEXT, "Queues")
    wait(browser, lambda d: "Lim" in d.find_element(By.XPATH, f"//a[text()='{unique}']/../..").text)


def test_a_monitoring_user_sees_no_admin_pages_and_a_wrong_password_is_refused(browser, console_broker, unique):
    add_user(console_broker, unique, "watch", tags="monitoring")
    set_permissions(console_broker, "/", unique)
    log_in(browser, console_broker, unique, "wrong")
    wait(browser, lambda d: text_of(d, "#login-error") == "Login failed")

    browser.refresh()
    log_in(browser, console_broker, unique, "watch")
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=overview] #alarms"))
    assert text_of(browser, "#who").startswith(f"{unique} (monitoring)")
    visible = [link.text for link in browser.find_elements(By.CSS_SELECTOR, "#nav a") if link.is_displayed()]
    assert visible == ["Overview", "Queues", "Exchanges", "Connections"]


def test_a_refused_login_says_why_once(browser, console_broker, unique):
    log_in(browser, console_broker, "guest", "wrong")
    wait(browser, lambda d: text_of(d, "#login-error"))
    assert text_of(browser, "#login-error") == "Login failed"  # the API's reason, not "Login failed: Login failed"

    add_user(console_broker, unique, "s3cret")  # no tags: the API knows the password but lets in no console
    browser.refresh()
    log_in(browser, console_broker, unique, "s3cret")
    wait(browser, lambda d: text_of(d, "#login-error") == "Login failed: Not management user")


def test_the_page_has_an_icon_and_keeps_to_the_content_security_policy(browser, console_broker):
    log_in(browser, console_broker)
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=overview] svg.chart"))
    click(browser, By.LINK_TEXT, "Queues")
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=queues] #queues"))
    # no favicon.ico 404 and no inline style refused by the API's Content-Security-Policy
    assert browser_errors(browser) == []

    icon = browser.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    status, kind = browser.execute_async_script(
        "fetch(arguments[0]).then((r) => arguments[1]([r.status, r.headers.get('Content-Type')]))", icon)
    assert (status, kind) == (200, "image/svg+xml")


def test_the_rate_chart_has_a_scale_and_lines_that_coincide_stay_apart(browser, console_broker):
    log_in(browser, console_broker)
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "main[data-page=overview] svg.chart"))
    # a minute of samples 5 s apart, newest first as the API gives them: as many messages published as delivered
    # (2/s) and a third of them acknowledged
    browser.execute_script("""
        const start = Date.UTC(2026, 0, 1, 12, 0, 0), samples = (perSecond) => Array.from({length: 13},
          (_, i) => ({timestamp: start + (12 - i) * 5000, sample: (12 - i) * 5 * perSecond}));
        const stats = {publish_details: {rate: 2, samples: samples(2)},
                       deliver_get_details: {rate: 2, samples: samples(2)},
                       ack_details: {rate: 0.6, samples: samples(0.6)}};
        const holder = document.createElement("div");
        holder.id = "test-chart";
        holder.append(chart(stats));
        document.body.append(holder);
    """)
    screenshot(browser, "chart")
    rates, times = chart_scale(browser, "#test-chart svg.chart")
    assert rates == ["0", "0.5", "1", "1.5", "2"]  # up to the least round value at or above the peak
    assert len(times) == 4 and [time[-2:] for time in times] == ["15", "30", "45", "00"], times  # every 15 s

    def line(key: str) -> dict:
        polyline = browser.find_element(By.CSS_SELECTOR, f"#test-chart polyline[data-key={key}]")
        return {name: polyline.get_attribute(name) for name in ("points", "stroke", "stroke-width",
                                                                   "stroke-dasharray")}
    publish, delivered, acked = line("publish"), line("deliver_get"), line("ack")
    assert publish["points"] == delivered["points"] != acked["points"]
    styles = [(each["stroke-width"], each["stroke-dasharray"]) for each in (publish, delivered, acked)]
    assert len(set(styles)) == 3, styles  # the one drawn over the other leaves it showing
    assert float(publish["stroke-width"]) > float(delivered["stroke-width"])
    assert delivered["stroke-dasharray"]

    legend = [entry.text for entry in browser.find_elements(By.CSS_SELECTOR, "#test-chart .legend span")]
    assert legend == ["publish 2.0/s", "deliver/get 2.0/s", "ack 0.6/s", "redeliver \u2013"]
    swatch = browser.find_element(By.CSS_SELECTOR, "#test-chart .legend span[data-key=deliver_get] line")
    assert swatch.get_attribute("stroke-dasharray") == delivered["stroke-dasharray"]


def test_the_overview_lists_every_worker_as_a_node(browser, own_broker, tmp_path):
    broker = own_broker("--workers", "2")
    log_in(browser, broker)
    rows = wait(browser, lambda d: [row.text for row in d.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")])
    assert [row.split()[0].split("@")[0] for row in rows] == ["warren-0", "warren-1"]
    assert all(" up " in f" {row} " for row in rows)
    assert text_of(browser, "#alarms") == "Alarms\nnone"
    assert "Running\n2 of 2" in text_of(browser, "#nodes-summary")
    screenshot(browser, "overview-workers")
