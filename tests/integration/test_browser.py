"""A real browser (headless Debian chromium via Selenium) against a real uvicorn serving the
project: log into the admin, filter and search messages, open one and see its history, restore
it after Redis lost its topic, open the dashboard. Screenshots go to .local/artifacts/browser/."""
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import redis
from django.conf import global_settings
from django.contrib.auth.models import User
from django.test.utils import override_settings

import project.settings
from delayqueue.api.http_protocol import HTTP_PROTOCOL
from delayqueue.models import Message
from delayqueue.runtime import run_with_runtime
from delayqueue.services.consume import pull_messages
from tests.helpers import REDIS_URL, ROOT, TEST_CONFIG, drain_history, log_database_url, send
from tools.stack import free_port

ARTIFACTS = ROOT / ".local" / "artifacts" / "browser"
# What a process of the project hashes passwords with (Django's default unless it sets its own).
PROJECT_PASSWORD_HASHERS = getattr(project.settings, "PASSWORD_HASHERS", global_settings.PASSWORD_HASHERS)
BROWSER, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")

pytestmark = [
    pytest.mark.usefixtures("clean_state"),
    pytest.mark.browser,
    pytest.mark.process,
    pytest.mark.skipif(not (BROWSER and DRIVER), reason="BROWSER TEST SKIPPED: chromium and chromedriver are not "
                       "installed and ./dev test could not install them (needs root and apt-get)"),
]


@pytest.fixture
def uvicorn_server():
    """uvicorn on a free port, on the test database and Redis, as ./dev run serves the app."""
    port = free_port()
    env = dict(os.environ, DATABASE_URL=log_database_url(), REDIS_URL=REDIS_URL,
               **{f"DELAYQUEUE_{k}": str(v) for k, v in TEST_CONFIG.items()})
    log = open(ARTIFACTS / "uvicorn.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--no-access-log", "--http", HTTP_PROTOCOL], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"uvicorn did not start: see {ARTIFACTS / 'uvicorn.log'}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


ARTIFACTS.mkdir(parents=True, exist_ok=True)


def arrive(driver, css: str):
    """Waits for the page a click navigated to (clicks return before the next page loads)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 20).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)))


def shot(driver, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def test_operator_walkthrough(uvicorn_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # Logged in by the uvicorn process, whose hashers are the project's (Django's), not the
    # fast one the tests' own process uses (tests/conftest.py): the user's hash is made with them.
    with override_settings(PASSWORD_HASHERS=PROJECT_PASSWORD_HASHERS):
        User.objects.create_superuser("ops", "ops@example.com", "s3cret-pass")
    send("browser", "b1", 600_000)
    send("browser", "b2", 0)
    send("other", "x1", 0)
    run_with_runtime(pull_messages, topic="browser")  # b2 is being consumed
    drain_history("browser")
    # Redis loses the topic (say, its cluster slot failed over to an empty replica).
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(*client.keys("dq:{default:browser}:*"))
    client.close()

    browser.get(uvicorn_server + "/admin/delayqueue/message/")
    assert "/admin/login/" in browser.current_url  # login required
    browser.find_element(By.ID, "id_username").send_keys("ops")
    browser.find_element(By.ID, "id_password").send_keys("s3cret-pass")
    shot(browser, "01-login")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    arrive(browser, "#changelist")
    assert "Select message to change" in browser.title
    assert browser.find_element(By.CSS_SELECTOR, "link[href*='admin/css/base.css']")  # static files served
    shot(browser, "02-message-list")

    browser.find_element(By.CSS_SELECTOR, "#changelist-filter a[href*='topic=browser']").click()
    arrive(browser, "#changelist-filter li.selected a[href*='topic=browser']")
    ids = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "th.field-msg_id a")]
    assert sorted(ids) == ["b1", "b2"]
    shot(browser, "03-filtered-by-topic")

    search = browser.find_element(By.ID, "searchbar")
    search.clear()
    search.send_keys("b2\n")
    arrive(browser, "#searchbar[value=b2]")
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, "th.field-msg_id a")] == ["b2"]
    browser.find_element(By.LINK_TEXT, "b2").click()
    arrive(browser, "#history")
    history = browser.find_element(By.ID, "history").text
    assert "Sent" in history and "Pulled" in history and "ready → consuming" in history
    assert "Not in Redis" in browser.find_element(By.ID, "live-state").text
    shot(browser, "04-message-history")

    browser.get(uvicorn_server + "/admin/delayqueue/message/?topic=browser")
    browser.find_element(By.ID, "action-toggle").click()  # select all on the page
    Select(browser.find_element(By.NAME, "action")).select_by_value("restore_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    arrive(browser, "ul.messagelist")
    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "Restored 2; 0 already live in Redis; 0 skipped" in message
    shot(browser, "05-restored")
    assert {m.msg_id: m.status for m in Message.objects.filter(topic="browser")} == {"b1": 1, "b2": 3}

    # The buttons on a message's page submit their own forms, not the page's (forms do not nest).
    browser.get(uvicorn_server + "/admin/delayqueue/message/?topic=browser&q=b1")
    browser.find_element(By.LINK_TEXT, "b1").click()
    arrive(browser, "#run-now")
    browser.find_element(By.ID, "run-now").click()
    arrive(browser, "ul.messagelist")
    assert "Due now: ready" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "ready" in browser.find_element(By.ID, "live-state").text
    shot(browser, "05b-run-now")

    browser.get(uvicorn_server + "/admin/")
    browser.find_element(By.LINK_TEXT, "Topic dashboard").click()
    arrive(browser, "#topics")
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-topic='browser']")
    assert row.find_element(By.CSS_SELECTOR, "td.waiting").text == "0"
    assert row.find_element(By.CSS_SELECTOR, "td.ready").text == "2"  # b1 run now; b2 came back ready, to be redelivered
    assert browser.find_element(By.ID, "lateness-chart")
    shot(browser, "06-dashboard")
