"""The approver's inbox in headless Chromium, as a non-staff approver: log in, find
the approval in "my approvals", read it, approve it with a comment and a payload, and
see the run go on; a user who may only see approvals gets no form. Screenshots of
each page go to the artifacts folder, at 1280 px."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User

from flowwarden_django.models import Approval, WorkflowRun
from tests.inbox.test_inbox import pending, refunds  # noqa: F401  (the fixture)
from tests.support.browser import BrowserPage, artifact_dir, start_chrome
from tests.support.lanes import on_lane

PASSWORD = "s3cret-pass"


class Page(BrowserPage):
    """A Chromium at 1280 x 900 on the inbox."""

    def log_in(self, username: str) -> None:
        self.driver.get(f"{self.base_url}/approvals/")
        self.present("#id_username").send_keys(username)
        self.driver.find_element("id", "id_password").send_keys(PASSWORD)
        self.driver.find_element("css selector", "#login-form [type=submit]").click()
        self.present("#user-tools")

    def fits(self) -> None:
        """No horizontal scroll: the page is as wide as the window."""
        scroll, width = self.driver.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth]"
        )
        assert scroll <= width, f"{self.driver.current_url}: {scroll} px in a {width} px window"


@pytest.fixture
def chrome(live_server: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            driver.set_window_size(1280, 900)
            yield Page(driver, live_server.url)
        finally:
            driver.quit()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_a_non_staff_approver_decides_in_the_inbox(chrome, refunds, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    finance = Group.objects.create(name="finance")
    bob = User.objects.create_user("bob", password=PASSWORD)
    bob.groups.add(finance)
    assert not bob.is_staff
    approval = pending(refunds, 750)
    shots = artifact_dir(tmp_path)

    chrome.log_in("bob")
    rows = chrome.present("#result_list").find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 1 and "Refund 750?" in rows[0].text
    chrome.fits()
    chrome.driver.save_screenshot(str(shots / "inbox-list.png"))

    rows[0].find_element(By.LINK_TEXT, "Refund 750?").click()
    assert '"amount": 750' in chrome.present("pre.flowwarden-json").text
    chrome.fits()
    chrome.driver.find_element(By.ID, "id_comment").send_keys("fine by me")
    chrome.driver.find_element(By.ID, "id_payload").send_keys('{"note": "from the inbox"}')
    chrome.driver.save_screenshot(str(shots / "inbox-approval.png"))
    chrome.driver.find_element(By.CSS_SELECTOR, "input[name=approve]").click()
    assert "Approved: Refund 750?" in chrome.present(".messagelist .success").text

    decided = Approval.objects.get(pk=approval.pk)
    assert (decided.status, decided.decided_by, decided.comment) == (
        "approved",
        "bob",
        "fine by me",
    )
    assert WorkflowRun.objects.get(pk=approval.coordination_id).status == "completed"


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_a_user_who_may_only_see_gets_no_form(chrome, refunds, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    viewer = User.objects.create_user("vera", password=PASSWORD)
    viewer.user_permissions.add(Permission.objects.get(codename="view_approval"))
    approval = pending(refunds, 80)

    chrome.log_in("vera")
    chrome.driver.get(f"{chrome.base_url}/approvals/?status=all")
    chrome.present("#result_list").find_element(By.LINK_TEXT, "Refund 80?").click()
    chrome.present("pre.flowwarden-json")
    assert not chrome.driver.find_elements(By.CSS_SELECTOR, "input[name=approve]")
    assert "not decide it" in chrome.driver.find_element(By.ID, "content-main").text
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_the_api_s_swagger_and_redoc_pages_render(chrome, tmp_path):
    """Their scripts come with the package (no CDN here): the pages draw the API."""
    from selenium.webdriver.common.by import By

    shots = artifact_dir(tmp_path)
    chrome.driver.get(f"{chrome.base_url}/api/v1/docs/")
    chrome.present(".swagger-ui .opblock")
    paths = [e.text for e in chrome.driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")]
    assert "/api/v1/approvals/{id}/approve/" in paths
    chrome.driver.save_screenshot(str(shots / "api-swagger.png"))

    chrome.driver.get(f"{chrome.base_url}/api/v1/redoc/")
    chrome.present("redoc h1, .api-info h1, [role=main] h1")
    assert "flowwarden-django API" in chrome.driver.find_element(By.TAG_NAME, "body").text
    chrome.driver.save_screenshot(str(shots / "api-redoc.png"))
