"""The grown-up inbox in headless Chromium, as a non-staff approver (issue 49, item
5): claim an approval with a decision form, fill it in wrong, see the form's error,
correct it and approve; then select three plain approvals on the list and approve
them at once. A screenshot at each stage goes to the artifacts folder (1280 px);
the database says what happened: every approval decided by the approver, every run
continued."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import workflow_registry
from tests.inbox.test_inbox import pending, refunds  # noqa: F401  (the fixture)
from tests.inbox.test_inbox_browser import PASSWORD, chrome  # noqa: F401  (the fixture)
from tests.support.browser import artifact_dir
from tests.support.lanes import on_lane
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds("browser-bulk-typed-refund")
    workflow_registry.unregister("browser-bulk-typed-refund")


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_claim_fill_the_form_then_bulk_approve_three(chrome, refunds, typed, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    bob = User.objects.create_user("bob", password=PASSWORD)
    bob.groups.add(Group.objects.create(name="finance"))
    assert not bob.is_staff
    plain = [pending(refunds, amount) for amount in (110, 220, 330)]
    # Deadlines to show: one due in two days, one past its escalation time (overdue).
    now = timezone.now()
    Approval.objects.filter(pk=plain[0].pk).update(expires_at=now + timedelta(days=2, minutes=1))
    Approval.objects.filter(pk=plain[1].pk).update(escalate_at=now - timedelta(minutes=5))
    started = typed.start({"order": 7, "total": "120.00"})
    form_typed = Approval.objects.get(coordination_id=started.coordination_id)
    shots = artifact_dir(tmp_path)

    # The list: a checkbox for each plain approval, "needs its form" for the typed one.
    chrome.log_in("bob")
    table = chrome.present("#result_list")
    assert len(table.find_elements(By.CSS_SELECTOR, "input[name=ids]")) == 3
    overdue = table.find_elements(By.CSS_SELECTOR, "tr.flowwarden-overdue-row")
    assert [row.find_element(By.CSS_SELECTOR, "th a").text for row in overdue] == ["Refund 220?"]
    due = table.find_elements(By.CSS_SELECTOR, "td.flowwarden-due time")
    assert [d.text.replace("\xa0", " ") for d in due] == ["in 2 days"]
    needs_form = table.find_element(By.CSS_SELECTOR, "a.flowwarden-needs-form")
    assert needs_form.text == "needs its form"
    chrome.fits()
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-1-list.png"))

    # Claim the typed approval, then its form: a wrong amount, its error, the fix.
    needs_form.click()
    chrome.present("input[name=claim]").click()
    assert "Claimed" in chrome.present(".messagelist .success").text
    assert Approval.objects.get(pk=form_typed.pk).claimed_by == "bob"
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-2-claimed.png"))
    amount = chrome.present("#id_form-amount")
    amount.clear()
    amount.send_keys("150")
    Select(chrome.driver.find_element(By.ID, "id_form-reason")).select_by_value("damaged")
    chrome.driver.find_element(By.CSS_SELECTOR, "input[name=approve]").click()
    error = chrome.present(".flowwarden-typed-form .errorlist")
    assert "At most the order's total, 120.00." in error.text
    assert Approval.objects.get(pk=form_typed.pk).status == "pending"
    chrome.fits()
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-3-form-error.png"))
    amount = chrome.driver.find_element(By.ID, "id_form-amount")
    amount.clear()
    amount.send_keys("80")
    chrome.driver.find_element(By.CSS_SELECTOR, "input[name=approve]").click()
    assert "Approved: Refund order 7?" in chrome.present(".messagelist .success").text
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-4-form-approved.png"))

    # Back on the list: select the three plain approvals and approve them at once.
    boxes = chrome.present("#result_list").find_elements(By.CSS_SELECTOR, "input[name=ids]")
    assert len(boxes) == 3
    for box in boxes:
        box.click()
    chrome.driver.find_element(By.ID, "id_bulk_comment").send_keys("month-end batch")
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-5-selected.png"))
    chrome.driver.find_element(
        By.CSS_SELECTOR, ".flowwarden-bulk-actions input[name=approve]"
    ).click()
    # The list page still shows the form's "Approved: ..." until the new one loads.
    assert chrome.shows(".messagelist .success", "Approved 3 approvals.")
    assert "Nothing waits for you." in chrome.driver.find_element(By.ID, "content-main").text
    chrome.driver.save_screenshot(str(shots / "inbox-bulk-6-approved.png"))

    decided = Approval.objects.get(pk=form_typed.pk)
    expected = {"amount": "80", "reason": "damaged", "refund_on": None}
    assert (decided.status, decided.decided_by, decided.payload) == ("approved", "bob", expected)
    assert seen_payloads == [expected]
    for approval in [form_typed, *plain]:
        assert WorkflowRun.objects.get(pk=approval.coordination_id).status == "completed"
    for approval in plain:
        row = Approval.objects.get(pk=approval.pk)
        assert (row.status, row.decided_by, row.comment) == ("approved", "bob", "month-end batch")
        assert row.events.filter(action="approved", actor="bob").count() == 1
