"""The served demo (``manage.py demo --serve``) in headless Chromium.

The demo runs as a subprocess on a fresh SQLite database and a free port, as a
newcomer runs ``make serve-demo``: the story, then the development server with the
``orders`` stream running in the same process on the scripted replica set, a feeder
writing an order every few seconds, and two orders parked as dead letters. The
browser logs in as the printed admin, sees the stream RUNNING in the Streams
console, discards one dead letter and replays the other, and looks at the approvals;
then as the printed approver (not staff) in the inbox, where it approves the pending one.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.browser import start_chrome
from tests.support.lanes import on_lane
from tests.support.services import free_port

#: It runs processes of its own (the sample project, a child interpreter).
pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "/admin/flowwarden_django"


def artifact_dir(tmp_path: Path) -> Path:
    """``FLOWWARDEN_TEST_ARTIFACTS`` when set (CI keeps it), else the test's tmp dir."""
    configured = os.environ.get("FLOWWARDEN_TEST_ARTIFACTS")
    directory = Path(configured) if configured else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class Demo:
    """``manage.py demo --serve`` in a subprocess; its output collected as it comes."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        addrport = ["--addrport", f"127.0.0.1:{port}"]
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--orders", "20", "--serve", *addrport],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.out)

    @property
    def errors(self) -> str:
        return "".join(self.err)

    def wait_until_serving(self, timeout: float) -> float:
        """Wait until the health view answers; the time it first did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the demo exited:\n{self.output}{self.errors}"
            try:
                with urllib.request.urlopen(f"{self.base}/flowwarden/health/", timeout=2):
                    return time.time()
            except urllib.error.HTTPError:
                return time.time()  # 503 until the stream reports: serving anyway
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"the demo did not serve within {timeout} s:\n{self.output}")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        for reader in self._readers:
            reader.join(5)
        return self.process.returncode


@on_lane("browser")
def test_the_served_demo_shows_both_halves_alive(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    env = {**os.environ, "SAMPLEPROJECT_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("FLOWWARDEN_MONGO_URL", None)
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr

    artifacts = artifact_dir(tmp_path)
    demo = Demo(env, free_port())
    try:
        served_at = demo.wait_until_serving(60)
        out = demo.output
        approver_password = re.search(r"log in as approver / (\S+)", out).group(1)
        admin_password = re.search(r"or as admin / (\S+)", out).group(1)
        assert f"{demo.base}/approvals/" in out  # the inbox
        negative = int(re.search(r"order (\d+) has a negative amount", out).group(1))
        held = int(re.search(r"order (\d+) is on hold until", out).group(1))
        hold_seconds = 15  # demo.HOLD_SECONDS: the hold started before the server
        python = os.path.relpath(sys.executable, ROOT)
        assert "python manage.py" not in out.replace(f"{python} manage.py", "")
        assert "Why runs and orders differ" in out

        with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
            driver = start_chrome(profile_dir)
            try:
                driver.set_window_size(1400, 1000)
                wait = WebDriverWait(driver, 15)

                def present(css: str):
                    return wait.until(
                        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
                    )

                # Log in as the printed admin (the operator).
                driver.get(f"{demo.base}/admin/")
                present("#id_username").send_keys("admin")
                driver.find_element(By.ID, "id_password").send_keys(admin_password)
                driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
                present("#user-tools")

                # The Streams console: orders RUNNING, with events (the status row is
                # published every STATUS_INTERVAL; reload until it shows).
                console = f"{demo.base}{ADMIN}/streamworker/"
                deadline = time.monotonic() + 20
                while True:
                    driver.get(console)
                    row = present("#result_list tbody tr")
                    state = row.find_element(By.CSS_SELECTOR, ".flowwarden-state").text
                    if state == "RUNNING" or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                name = row.find_element(By.CSS_SELECTOR, "th.field-name").text
                assert name.splitlines() == ["orders", "ALL_INSTANCES"]
                assert state == "RUNNING", row.text
                assert "no report from" not in row.text
                driver.save_screenshot(str(artifacts / "demo-streams-console.png"))

                # The dead letters: discard the negative amount...
                driver.get(f"{demo.base}{ADMIN}/deadletter/")
                rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
                assert len(rows) == 2, [r.text for r in rows]
                assert all("Pending" in r.text for r in rows)

                def act(phrase: str, action: str, button: str) -> str:
                    """Select the entry whose error contains *phrase*, run *action*, confirm."""
                    query = urllib.parse.urlencode({"q": f'"{phrase}"'})
                    driver.get(f"{demo.base}{ADMIN}/deadletter/?{query}")
                    (checkbox,) = driver.find_elements(
                        By.CSS_SELECTOR, "#result_list input.action-select"
                    )
                    checkbox.click()
                    Select(driver.find_element(By.NAME, "action")).select_by_visible_text(action)
                    driver.find_element(
                        By.CSS_SELECTOR, "#changelist-form button[name=index]"
                    ).click()
                    present("#flowwarden-dlq-entries")
                    submit = driver.find_element(By.CSS_SELECTOR, ".submit-row input[type=submit]")
                    assert submit.get_attribute("value") == button
                    submit.click()
                    return present(".messagelist li").text

                assert (
                    act(f"order {negative} has", "Discard selected dead letters", "Yes, discard")
                    == "Discarded 1 dead letter."
                )
                # ...and replay the order on hold once its hold has passed: it goes through.
                time.sleep(max(0.0, served_at + hold_seconds + 1 - time.time()))
                assert (
                    act(f"order {held} is on hold", "Replay selected dead letters", "Yes, replay")
                    == "Replayed 1 dead letter."
                )
                driver.get(f"{demo.base}{ADMIN}/deadletter/")
                present("#result_list")
                statuses = sorted(
                    badge.get_attribute("data-status")
                    for badge in driver.find_elements(
                        By.CSS_SELECTOR, "#result_list td.field-status_and_counts [data-status]"
                    )
                )
                assert statuses == ["DISCARDED", "REPLAYED"]

                # The approvals at 1280 px: no sideways scrolling.
                driver.set_window_size(1280, 900)
                driver.get(f"{demo.base}{ADMIN}/approval/")
                link = present("#result_list tbody tr th a")
                widths = driver.execute_script(
                    "const r = document.querySelector('.results');"
                    "return [document.documentElement.scrollWidth, window.innerWidth,"
                    " r.scrollWidth, r.clientWidth]"
                )
                driver.save_screenshot(str(artifacts / "demo-approvals-1280.png"))
                assert widths[0] <= widths[1], f"the approvals page scrolls sideways: {widths}"
                # Nor does the table inside it (the nav sidebar and the filters take room).
                assert widths[2] <= widths[3], f"the approvals table scrolls sideways: {widths}"

                # An approval's page.
                link.click()
                present("#content h1")
                driver.save_screenshot(str(artifacts / "demo-approval.png"))

                # The approver, who is not staff, decides the pending approval in the inbox.
                driver.delete_all_cookies()
                driver.get(f"{demo.base}/approvals/")
                present("#id_username").send_keys("approver")
                driver.find_element(By.ID, "id_password").send_keys(approver_password)
                driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
                present("#result_list").find_element(By.PARTIAL_LINK_TEXT, "Approve order").click()
                # The sample's decision form: the amount (the order's total, initially)
                # and a reason from a list.
                assert present("input[name='form-approved_amount']").get_attribute("value")
                Select(present("select[name='form-reason']")).select_by_value("known_customer")
                present("input[name=approve]").click()
                assert "Approved" in present(".messagelist .success").text
                driver.get(f"{demo.base}/admin/")
                assert present("#login-form")  # no way into the admin: not staff
            finally:
                driver.quit()
    finally:
        demo.stop()
    assert "Traceback" not in demo.output + demo.errors, demo.errors
    for name in ("demo-streams-console.png", "demo-approvals-1280.png", "demo-approval.png"):
        assert (artifacts / name).read_bytes().startswith(b"\x89PNG")


def test_a_busy_port_fails_before_the_story(tmp_path):
    """``demo --serve`` on a port in use: a CommandError naming the port and the fix,
    before any order is written."""
    env = {**os.environ, "SAMPLEPROJECT_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("FLOWWARDEN_MONGO_URL", None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "demo", "--serve", "--addrport", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert "--addrport" in result.stderr and "Traceback" not in result.stderr
    assert "Wrote" not in result.stdout and "MongoDB" not in result.stdout
    malformed = subprocess.run(
        [sys.executable, "manage.py", "demo", "--serve", "--addrport", "localhost:http"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert malformed.returncode == 1 and "is not [host:]port" in malformed.stderr
