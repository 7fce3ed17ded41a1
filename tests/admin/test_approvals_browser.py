"""Approvals and snapshot trees in headless Chromium, against the live test server.

The live server runs in this process, so the workflow defined here is the one the
server resumes when the browser approves.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Workflow,
    WorkflowSnapshot,
    await_approval,
    done,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support.browser import BrowserPage, artifact_dir, start_chrome
from tests.support.lanes import on_lane

PASSWORD = "s3cret-pass"


@step
def review(state: dict[str, Any]) -> Any:
    return await_approval(
        {**state, "review": "manual"}, f"Refund {state['amount']}?", group="finance"
    )


@step
def settle(state: dict[str, Any], ctx: Any) -> Any:
    decision = ctx.decision
    return done(
        {**state, "outcome": decision.decision, "note": (decision.payload or {}).get("note")}
    )


@pytest.fixture
def refunds() -> Any:
    definition = Workflow.define("browser-refund", [review, settle], OrmSnapshotStore())
    yield definition
    workflow_registry.unregister("browser-refund")


class Browser(BrowserPage):
    """A logged-in Chromium and the waits the tests use."""

    def log_in(self, username: str) -> None:
        self.driver.get(f"{self.base_url}/admin/")
        self.present("#id_username").send_keys(username)
        self.driver.find_element("id", "id_password").send_keys(PASSWORD)
        self.click("#login-form [type=submit]")
        self.present("#content-main")

    def script(self, code: str, *args: Any) -> Any:
        return self.driver.execute_script(code, *args)


@pytest.fixture
def browser(live_server: Any) -> Any:
    User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            driver.set_window_size(1600, 1000)
            session = Browser(driver, live_server.url)
            session.log_in("operator")
            yield session
        finally:
            driver.quit()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_approve_in_the_browser_and_see_the_run_go_on(browser, refunds, tmp_path):
    from selenium.webdriver.common.by import By

    started = refunds.start({"amount": 500})
    cid = started.coordination_id
    approval = Approval.objects.get(coordination_id=cid)
    assert WorkflowRun.objects.get(pk=cid).status == "waiting"

    # From the admin index to the approvals changelist, then the pending approval.
    browser.click("a[href$='/flowwarden_django/approval/']")
    rows = browser.present("#result_list").find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 1 and "Refund 500?" in rows[0].text and "Pending" in rows[0].text
    rows[0].find_element(By.LINK_TEXT, "Refund 500?").click()
    assert browser.present(".flowwarden-prompt").text == "Refund 500?"
    assert '"review": "manual"' in browser.present("pre.flowwarden-state").text
    audit = browser.present("#flowwarden-audit").text
    assert "Requested" in audit

    # Approve, through the confirmation page.
    browser.click("a.flowwarden-approve")
    browser.present("#flowwarden-decision-form")
    assert browser.driver.find_element(By.CSS_SELECTOR, "#content h1").text == "Approve"
    browser.driver.find_element(By.ID, "id_comment").send_keys("fine by me")
    browser.driver.find_element(By.ID, "id_payload").send_keys('{"note": "from the browser"}')
    browser.click("#flowwarden-decision-form .submit-row input[type=submit]")
    success = browser.present(".messagelist .success").text
    assert success == f"Approved “Refund 500?”. Run {cid} is completed now."
    assert "Approved" in browser.present(".field-status_icon .readonly").text
    audit = browser.present("#flowwarden-audit").text
    assert "operator" in audit and "fine by me" in audit

    # The run completed: on its page and in the runs changelist.
    browser.click("a.flowwarden-run-link")
    status = browser.present(".field-status_icon [data-status]")
    assert status.get_attribute("data-status") == "completed"
    assert status.text == "Completed"
    run_page = browser.driver.current_url
    browser.driver.get(f"{browser.base_url}/admin/flowwarden_django/workflowrun/")
    listed = browser.present("#result_list td.field-status_icon [data-status]")
    assert listed.get_attribute("data-status") == "completed"

    # The snapshot tree: the settle step's snapshot continues the approval's snapshot.
    browser.driver.get(run_page)
    browser.click("a.flowwarden-run-tree")
    browser.present("#flowwarden-snapshot-tree")
    run = WorkflowRun.objects.get(pk=cid)
    settled = OrmSnapshotStore().load(run.head_snapshot_id)
    assert settled.parent_id == approval.snapshot_id
    assert settled.metadata["workflow.lastStep"] == "settle"
    node = browser.present(f"#fw-node-{settled.id}")
    assert node.get_attribute("data-parent") == approval.snapshot_id
    assert "fw-head" in node.get_attribute("class")
    previous = browser.script("return arguments[0].previousElementSibling.id", node)
    assert previous == f"fw-node-{approval.snapshot_id}"
    card = node.find_element(By.CSS_SELECTOR, ".fw-card").text
    assert "#3" in card and "settle" in card and "HEAD" in card.upper()
    assert len(browser.driver.find_elements(By.CSS_SELECTOR, "li.fw-node")) == 3
    header_background = browser.script(
        "return getComputedStyle(document.getElementById('header')).backgroundColor"
    )
    assert header_background not in ("", "transparent", "rgba(0, 0, 0, 0)")

    screenshot = artifact_dir(tmp_path) / "admin-approval-snapshot-tree.png"
    browser.driver.save_screenshot(str(screenshot))
    print(f"snapshot tree screenshot: {screenshot}")
    assert screenshot.read_bytes().startswith(b"\x89PNG")
    assert screenshot.stat().st_size > 30_000


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_a_long_tree_loads_more_in_the_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By

    store = OrmSnapshotStore()
    cid = "browser-long-run"
    head = store.save(WorkflowSnapshot.root(cid, {"n": 0}, metadata={"workflow.lastStep": ""}))
    chain = [head]
    for n in range(1, 250):
        head = store.save(head.derive_with({"n": n}, metadata={"workflow.lastStep": f"s{n}"}))
        chain.append(head)
    fork = store.fork(chain[49].id, {"n": "forked"})  # seq 251, on the last page
    now = timezone.now()
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name="browser-unregistered",
        status="hibernated",
        head_snapshot_id=fork.id,
        created_at=now,
        updated_at=now,
    )

    browser.driver.get(f"{browser.base_url}/admin/flowwarden_django/workflowrun/{cid}/tree/")
    browser.present("#flowwarden-snapshot-tree")

    def shown() -> int:
        return len(browser.driver.find_elements(By.CSS_SELECTOR, "li.fw-node"))

    assert shown() == 100
    for expected in (200, 251):
        browser.click("#flowwarden-load-more")
        browser.wait.until(lambda _, n=expected: shown() == n)
        count = browser.driver.find_element(By.ID, "flowwarden-tree-count").text
        assert count == str(expected)
    assert not browser.driver.find_elements(By.ID, "flowwarden-load-more")
    assert browser.driver.find_element(By.ID, "flowwarden-tree-error").text == ""

    # Node 101 continued node 100's chain; the fork is a branch under #50.
    previous = browser.script(
        "return document.getElementById(arguments[0]).previousElementSibling.id",
        f"fw-node-{chain[100].id}",
    )
    assert previous == f"fw-node-{chain[99].id}"
    branch_parent = browser.script(
        "return document.getElementById(arguments[0]).closest('ol.fw-branches').parentElement.id",
        f"fw-node-{fork.id}",
    )
    assert branch_parent == f"fw-node-{chain[49].id}"
    fork_badges = browser.driver.find_element(
        By.CSS_SELECTOR, f"#fw-node-{chain[49].id} .fw-badges"
    )
    assert "FORK" in fork_badges.text.upper()
    assert "fw-head" in browser.present(f"#fw-node-{fork.id}").get_attribute("class")
    # Only one chain, and no "parent on an earlier page" notes: nothing was left detached.
    assert not browser.driver.find_elements(
        By.CSS_SELECTOR, "#flowwarden-snapshot-tree .fw-detached"
    )
    assert (
        browser.script("return document.querySelectorAll('#flowwarden-snapshot-tree > ol').length")
        == 1
    )

    browser.script(
        "document.getElementById(arguments[0]).scrollIntoView()", f"fw-node-{chain[45].id}"
    )
    screenshot = artifact_dir(tmp_path) / "admin-snapshot-tree-long.png"
    browser.driver.save_screenshot(str(screenshot))
    print(f"long snapshot tree screenshot: {screenshot}")
    assert screenshot.read_bytes().startswith(b"\x89PNG")
