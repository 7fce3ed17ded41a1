"""Issue 50 in Chromium: the timeline of a run with a failed-then-successful
attempt, an approval wait, a sleep and two children, and its workflow's diagram
and the "Workflows" page, at 1280 px with the navigation sidebar open: no sideways
scroll, every bar labelled, the current position marked; screenshots saved."""

from __future__ import annotations

import tempfile

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from selenium.webdriver.support.ui import WebDriverWait

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import workflow_registry
from tests.support.browser import artifact_dir, start_chrome
from tests.support.lanes import on_lane
from tests.support.timeline_workflow import ORDERS, define_orders, drive_orders, forget_orders

PASSWORD = "s3cret-pass"
CID = "shop.orders:7-with-a-rather-long-coordination-id"
#: Measured in the page: its width, the window's, and the bars without a label.
MEASURE = """
const doc = document.documentElement;
const sidebar = document.getElementById('nav-sidebar');
const open = !!sidebar && getComputedStyle(sidebar).display !== 'none'
  && getComputedStyle(sidebar).visibility !== 'hidden';
const bars = [...document.querySelectorAll('.fw-bar')];
const unlabelled = bars.filter(b => !(b.getAttribute('aria-label') || '').trim()
  || b.getAttribute('role') !== 'img').length;
const hidden = bars.filter(b => b.getBoundingClientRect().width < 1).length;
const steps = [...document.querySelectorAll('.fw-step-box')]
  .filter(b => !(b.getAttribute('aria-label') || '').trim()).length;
return {scroll: doc.scrollWidth, client: doc.clientWidth, open, bars: bars.length,
        unlabelled, hidden, unlabelledSteps: steps,
        current: document.querySelectorAll('[aria-current="step"]').length};
"""


@pytest.fixture
def orders_run():
    define_orders()
    try:
        operator = User.objects.create_superuser("operator", "op@example.com", PASSWORD)
        run = drive_orders(CID, operator)
        # And one run still waiting for its approval, for the diagram's position.
        workflow_registry.get(ORDERS).start({"order": 8}, coordination_id=CID + "-2")
        yield run
    finally:
        forget_orders()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_timeline_and_diagram_fit_1280_px_with_every_bar_labelled(
    live_server, orders_run, tmp_path
):
    waiting = WorkflowRun.objects.get(pk=CID + "-2")
    pages = {
        "timeline": reverse("admin:flowwarden_django_workflowrun_change", args=[CID]),
        "timeline-waiting": reverse(
            "admin:flowwarden_django_workflowrun_change", args=[waiting.pk]
        ),
        "diagram": reverse("admin:flowwarden_django_definedworkflow_diagram", args=[ORDERS, 1])
        + f"?run={waiting.pk}",
        "workflows": reverse("admin:flowwarden_django_definedworkflow_changelist"),
    }
    shots = artifact_dir(tmp_path)
    results = {}
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            driver.set_window_size(1280, 900)
            driver.get(f"{live_server.url}/admin/login/")
            driver.find_element("id", "id_username").send_keys("operator")
            driver.find_element("id", "id_password").send_keys(PASSWORD)
            driver.find_element("css selector", "#login-form [type=submit]").click()
            WebDriverWait(driver, 30).until(lambda d: "/login/" not in d.current_url)
            driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
            for name, page in pages.items():
                driver.get(live_server.url + page)
                WebDriverWait(driver, 30).until(
                    lambda d: d.execute_script("return document.readyState") == "complete"
                )
                if name.startswith("timeline"):
                    timeline = driver.find_element("id", "flowwarden-timeline")
                    driver.execute_script("arguments[0].scrollIntoView()", timeline)
                results[name] = driver.execute_script(MEASURE)
                driver.save_screenshot(str(shots / f"observability-{name}.png"))
                if name.startswith("timeline"):
                    timeline.screenshot(str(shots / f"observability-{name}-only.png"))
            # Dark mode: the admin's own colour variables (a look, not an assertion).
            driver.execute_script("localStorage.setItem('theme', 'dark')")
            driver.get(live_server.url + pages["timeline"])
            timeline = driver.find_element("id", "flowwarden-timeline")
            driver.execute_script("arguments[0].scrollIntoView()", timeline)
            results["timeline-dark"] = driver.execute_script(MEASURE)
            timeline.screenshot(str(shots / "observability-timeline-dark.png"))
        finally:
            driver.quit()
    for name, found in results.items():
        assert found["open"], (name, found)
        assert found["scroll"] <= found["client"], (name, found)
        assert found["unlabelled"] == 0 and found["hidden"] == 0, (name, found)
        assert found["unlabelledSteps"] == 0, (name, found)
    assert results["timeline"]["bars"] >= 11  # 6 attempts, 3 waits, 2 children
    assert results["timeline"]["current"] == 1
    assert results["timeline-waiting"]["current"] == 1
    assert results["diagram"]["current"] == 2  # where it stands, where it continues
