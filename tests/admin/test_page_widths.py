"""Every admin page of the package fits a 1280 px window, with the navigation sidebar
open and closed: no sideways scroll, and no table wider than the box it sits in (a
column cut off). Headless Chromium against the live test server, with one object of
each kind (a stream with its status rows and checkpoint, a dead letter with a real
traceback, a run waiting for its approval, with its snapshots); a screenshot of each
page in each layout goes to the artifacts folder."""

from __future__ import annotations

import tempfile

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.streams.checkpoint import Checkpoint
from flowwarden_django.streams.stores import checkpoint_stores
from tests.admin.test_dead_letters import PoisonStream, park
from tests.browser import artifact_dir, start_chrome
from tests.lanes import on_lane
from tests.status_rows import worker
from tests.test_inbox import pending, refunds  # noqa: F401  (the fixture)

PASSWORD = "s3cret-pass"
STREAM = "widths-orders-with-a-rather-long-stream-name"
#: Measured in the page: the document, and each table against its box.
MEASURE = """
const doc = document.documentElement;
const cut = [];
for (const table of document.querySelectorAll('#content table')) {
  const box = table.closest('.results, .module, fieldset, #changelist, #content-main')
    || table.parentElement;
  if (table.scrollWidth > box.clientWidth + 1) {
    const name = table.id || table.className || 'table';
    cut.push(`${name}: ${table.scrollWidth} px in ${box.clientWidth} px`);
  }
}
for (const pre of document.querySelectorAll('#content pre')) {
  if (pre.scrollWidth > pre.clientWidth + 1 && getComputedStyle(pre).overflowX === 'visible') {
    cut.push(`pre: ${pre.scrollWidth} px in ${pre.clientWidth} px`);
  }
}
return [doc.scrollWidth, window.innerWidth, cut];
"""


def package_pages() -> list[str]:
    """The changelist and one change page of each model the package registers, and
    the pages beside them (the console's confirmation, a run's snapshot, tree and
    fork pages, a dead letter's operations, a decision's confirmation)."""
    pages: list[str] = []
    for model in admin.site._registry:
        opts = model._meta
        if opts.app_label != "flowwarden_django":
            continue
        pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        obj = model._default_manager.order_by("pk").first()
        if obj is not None:
            pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
    run = WorkflowRun.objects.get()
    pages.append(reverse("admin:flowwarden_django_workflowrun_tree", args=[run.pk]))
    snapshot = run.head_snapshot_id
    pages.append(reverse("admin:flowwarden_django_workflowrun_snapshot", args=[run.pk, snapshot]))
    pages.append(reverse("admin:flowwarden_django_workflowrun_fork", args=[run.pk, snapshot]))
    pages.append(reverse("admin:flowwarden_django_streamworker_control", args=["restart", STREAM]))
    return pages


@pytest.fixture
def objects(refunds):  # noqa: F811
    stream = PoisonStream(STREAM).register()
    try:
        worker(STREAM, "host-with-a-long-name.example.internal:12345", "running", events=12)
        now = timezone.now()
        checkpoint_stores["default"].save_seen(
            STREAM,
            {"_data": "8263A1B2C3000000012B022C0100296E5A1004" + "AB" * 20},
            now,
            heartbeat_at=now,
        )
        assert isinstance(checkpoint_stores["default"].find(STREAM), Checkpoint)
        park(STREAM, 42)
        pending(refunds, 4200)
        assert Approval.objects.count() == 1
        yield
    finally:
        stream.unregister()


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_every_admin_page_fits_1280_px_with_the_sidebar_open_or_closed(
    live_server, objects, tmp_path
):
    User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    pages = package_pages()
    shots = artifact_dir(tmp_path)
    overflowing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fw-chrome-") as profile_dir:
        driver = start_chrome(profile_dir)
        try:
            driver.set_window_size(1280, 900)
            driver.get(f"{live_server.url}/admin/login/")
            driver.find_element("id", "id_username").send_keys("operator")
            driver.find_element("id", "id_password").send_keys(PASSWORD)
            driver.find_element("css selector", "#login-form [type=submit]").click()
            for sidebar in ("open", "closed"):
                driver.execute_script(
                    "localStorage.setItem('django.admin.navSidebarIsOpen', arguments[0])",
                    "true" if sidebar == "open" else "false",
                )
                for number, page in enumerate(pages):
                    driver.get(live_server.url + page)
                    shown = driver.execute_script(
                        "const s = document.getElementById('nav-sidebar');"
                        "return !!s && getComputedStyle(s).display !== 'none'"
                        " && getComputedStyle(s).visibility !== 'hidden'"
                    )
                    assert shown == (sidebar == "open" and "/admin/" in page), (page, sidebar)
                    width, window, cut = driver.execute_script(MEASURE)
                    driver.save_screenshot(str(shots / f"width-{sidebar}-{number:02d}.png"))
                    if width > window or cut:
                        overflowing.append(f"{page} (sidebar {sidebar}): {width} px; {cut}")
        finally:
            driver.quit()
    assert not overflowing, "\n".join(overflowing)
