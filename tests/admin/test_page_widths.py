"""Every admin page of the package fits a 1280 px window, with the navigation sidebar
open and closed: no sideways scroll, no table wider than the box it sits in (a
column cut off), no word of a table cell broken across two lines (an id, a status,
a step name: ``sho/p.or/der/s:3/551`` or ``Compl/eted``), a list as wide as its
module with its count below it, and the breadcrumbs in the admin's styled bar as on
Django's own pages (Django 6.1 styles only its ``<ol class="breadcrumbs">``). The
inbox's list and approval pages are measured too. Headless Chromium against the live
test server, with one object of each kind (a stream with its status rows and
checkpoint, a dead letter with a real traceback, a run by its idempotency key waiting
for its approval, with its snapshots, a run with long-named messages and events);
a screenshot of each page in each layout goes to the artifacts folder."""

from __future__ import annotations

import tempfile

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.urls import reverse
from django.utils import timezone
from selenium.webdriver.support.ui import WebDriverWait

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.streams.checkpoint import Checkpoint
from flowwarden_django.streams.stores import checkpoint_stores
from flowwarden_django.workflows import send_message, workflow_registry
from tests.admin.test_dead_letters import PoisonStream, park
from tests.inbox.test_inbox import refunds  # noqa: F401  (the fixture)
from tests.support.browser import artifact_dir, start_chrome
from tests.support.lanes import on_lane
from tests.support.payments_workflow import define_payments
from tests.support.status_rows import worker

PASSWORD = "s3cret-pass"
STREAM = "widths-orders-with-a-rather-long-stream-name"
#: A run known by a long key, with messages and events of long names.
MAILBOX_RUN = "shop.orders:3552.payments-with-a-rather-long-coordination-id"
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
// A word (what lies between spaces) of a table cell drawn on more than one line.
for (const cell of document.querySelectorAll('#content table th, #content table td')) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (parent.closest('th, td') !== cell || parent.closest('pre, select, textarea')) continue;
    for (const word of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      const lines = new Set(
        [...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.bottom)));
      if (lines.size > 1) cut.push(`"${word[0]}" broken over ${lines.size} lines`);
    }
  }
}
// A list narrower than its module (no filter beside it), or its count beside it.
for (const list of document.querySelectorAll('#changelist')) {
  const table = list.querySelector('table');
  if (!table || list.querySelector('#changelist-filter')) continue;
  const [own, room] = [table.getBoundingClientRect(), list.getBoundingClientRect()];
  if (own.width < room.width - 2) cut.push(`list ${own.width} px wide in ${room.width} px`);
  for (const count of list.querySelectorAll('.paginator')) {
    const box = count.getBoundingClientRect();
    if (box.top < own.bottom - 1 && box.bottom > own.top + 1) cut.push('count beside the list');
  }
}
const crumbs = document.querySelector('.breadcrumbs');
const crumbsAt = crumbs && (crumbs.querySelector('a') || crumbs).getBoundingClientRect().left;
return [doc.scrollWidth, window.innerWidth, cut,
        crumbs && [getComputedStyle(crumbs).backgroundColor, Math.round(crumbsAt)]];
"""


def package_pages() -> list[str]:
    """The changelist and one change page of each model the package registers, and
    the pages beside them (the console's confirmation, a run's snapshot, tree and
    fork pages, the page of the run with messages, a dead letter's operations, a
    decision's confirmation)."""
    pages: list[str] = []
    for model in admin.site._registry:
        opts = model._meta
        if opts.app_label != "flowwarden_django":
            continue
        pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        obj = model._default_manager.order_by("pk").first()
        if obj is not None:
            pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
    pages.append(reverse("admin:flowwarden_django_workflowrun_change", args=[MAILBOX_RUN]))
    run = WorkflowRun.objects.get(idempotency_key="shop.orders:3551")
    pages.append(reverse("admin:flowwarden_django_workflowrun_tree", args=[run.pk]))
    snapshot = run.head_snapshot_id
    pages.append(reverse("admin:flowwarden_django_workflowrun_snapshot", args=[run.pk, snapshot]))
    pages.append(reverse("admin:flowwarden_django_workflowrun_fork", args=[run.pk, snapshot]))
    pages.append(reverse("admin:flowwarden_django_streamworker_control", args=["restart", STREAM]))
    pages.append(reverse("flowwarden-inbox:list"))
    pages.append(reverse("flowwarden-inbox:approval", args=[Approval.objects.get().pk]))
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
        # Known by a key with dots and a colon, as a shop's orders are.
        refunds.start({"amount": 4200}, idempotency_key="shop.orders:3551")
        assert Approval.objects.count() == 1
        mailbox_run()
        yield
    finally:
        stream.unregister()
        workflow_registry.unregister("payments")


def mailbox_run() -> None:
    """A run with messages and events of long names and payloads: pending ones on
    another topic, its payment delivered."""
    payments = define_payments("payments")
    payments.start({"order": 3552}, coordination_id=MAILBOX_RUN)
    long_name = "warehouse.parcel-scanned-at-the-north-gate"
    for number in range(3):
        send_message(
            MAILBOX_RUN,
            long_name,
            {"parcel": "P" * 120, "scans": [{"at": "2024-05-01T12:00:00Z", "n": number}]},
            sender="msg-0f3a9c4e5d6b7a8c9d0e1f2a3b4c5d6e",
            idempotency_key=f"carrier.events:2024-05-01:{long_name}:{number}",
        )
    send_message(MAILBOX_RUN, "payment", {"amount": 4200}, sender="psp", idempotency_key="pi_3")
    assert WorkflowRun.objects.get(pk=MAILBOX_RUN).status == "completed"  # delivered


@on_lane("browser")
@pytest.mark.django_db(transaction=True)
def test_every_admin_page_fits_1280_px_with_the_sidebar_open_or_closed(
    live_server, objects, tmp_path
):
    operator = User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    operator.groups.add(Group.objects.create(name="finance"))  # the inbox lists the approval
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
            # Logged in (the POST answered) before the next page is asked for.
            WebDriverWait(driver, 30).until(lambda d: "/login/" not in d.current_url)
            # Django's own app index: how its breadcrumbs bar looks (colour, text inset).
            driver.get(f"{live_server.url}/admin/flowwarden_django/")
            styled = driver.execute_script(MEASURE)[3]
            assert styled[0] not in ("rgba(0, 0, 0, 0)", "transparent") and styled[1] > 0
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
                    width, window, cut, crumbs = driver.execute_script(MEASURE)
                    if "/admin/" in page and crumbs != styled:
                        cut.append(f"breadcrumbs {crumbs}, not in the bar {styled}")
                    driver.save_screenshot(str(shots / f"width-{sidebar}-{number:02d}.png"))
                    if width > window or cut:
                        overflowing.append(f"{page} (sidebar {sidebar}): {width} px; {cut}")
        finally:
            driver.quit()
    assert not overflowing, "\n".join(overflowing)
