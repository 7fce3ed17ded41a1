"""A typed decision form in the inbox, in headless Chromium, as a non-staff approver:
the form shows its initial data, an amount over the order's total is refused with
the form's error (what was typed kept), the corrected entry approves and the run
gets the cleaned data. Screenshots go to the artifacts folder, at 1280 px."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import workflow_registry
from tests.inbox.test_inbox_browser import PASSWORD, chrome  # noqa: F401  (the fixture)
from tests.support.browser import artifact_dir
from tests.support.lanes import on_lane
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds("browser-typed-refund")
    workflow_registry.unregister("browser-typed-refund")


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_an_approver_fills_the_form_sees_an_error_and_approves(chrome, typed, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    bob = User.objects.create_user("bob", password=PASSWORD)
    bob.groups.add(Group.objects.create(name="finance"))
    started = typed.start({"order": 7, "total": "120.00"})
    approval = Approval.objects.get(coordination_id=started.coordination_id)
    shots = artifact_dir(tmp_path)

    chrome.log_in("bob")
    chrome.present("#result_list").find_element(By.LINK_TEXT, "Refund order 7?").click()
    amount = chrome.present("#id_form-amount")
    assert amount.get_attribute("value") == "120.00"  # the initial data
    assert not chrome.driver.find_elements(By.ID, "id_payload")
    chrome.fits()
    amount.clear()
    amount.send_keys("150")
    Select(chrome.driver.find_element(By.ID, "id_form-reason")).select_by_value("late")
    chrome.driver.save_screenshot(str(shots / "inbox-form.png"))
    chrome.driver.find_element(By.CSS_SELECTOR, "input[name=approve]").click()

    error = chrome.present(".flowwarden-typed-form .errorlist")
    assert "At most the order's total, 120.00." in error.text
    amount = chrome.driver.find_element(By.ID, "id_form-amount")
    assert amount.get_attribute("value") == "150"  # what was typed is kept
    chrome.fits()
    chrome.driver.save_screenshot(str(shots / "inbox-form-error.png"))
    amount.clear()
    amount.send_keys("99.90")
    chrome.driver.find_element(By.CSS_SELECTOR, "input[name=approve]").click()
    assert "Approved: Refund order 7?" in chrome.present(".messagelist .success").text
    chrome.driver.save_screenshot(str(shots / "inbox-form-approved.png"))

    expected = {"amount": "99.90", "reason": "late", "refund_on": None}
    assert Approval.objects.get(pk=approval.pk).payload == expected
    assert seen_payloads == [expected]
    assert WorkflowRun.objects.get(pk=approval.coordination_id).status == "completed"
