"""Typed decision forms (issue 49): ``await_approval(form=..., initial=...)`` checks
the form when the step asks, ``decide`` validates an approval's payload with it and
hands the cleaned data, JSON-safe, to the next step; a form that no longer imports
refuses approving (not rejecting) and fails ``check`` (E211)."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import pytest
from django import forms
from django.contrib.auth.models import Group, User
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from flowwarden_django.checks.approvals import check_approval_forms
from flowwarden_django.models import Approval
from flowwarden_django.workflows import Completed, Hibernated, await_approval, workflow_registry
from flowwarden_django.workflows.waiting.approvals import (
    ApprovalError,
    ApprovalFormError,
    ApprovalFormUnavailableError,
    approve,
    describe_form,
    reject,
    sweep_approvals,
)
from flowwarden_django.workflows.waiting.approvals.forms import json_safe
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads
from tests.testapp.forms import RefundDecisionForm

pytestmark = pytest.mark.django_db(transaction=True)
FORM_PATH = "tests.testapp.forms.RefundDecisionForm"


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds()
    workflow_registry.unregister("typed_refund")


@pytest.fixture
def alice() -> User:
    Group.objects.create(name="finance")
    return User.objects.create_user("alice", password="pw")


def pending(definition: Any, **state: Any) -> Approval:
    started = definition.start({"order": 7, "total": "120.00", **state})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


def test_the_form_path_and_initial_are_stored(typed: Any) -> None:
    approval = pending(typed)
    assert approval.form == FORM_PATH
    assert approval.form_initial == {"order_total": "120.00", "amount": "120.00"}
    requested = approval.events.get(action="requested")
    assert requested.payload["form"] == FORM_PATH


def test_a_valid_payload_hands_the_cleaned_data_on(typed: Any, alice: User) -> None:
    approval = pending(typed)
    result = approve(
        approval.pk,
        alice,
        payload={"amount": "99.5", "reason": "late", "refund_on": "2026-12-24", "extra": 1},
    )
    assert isinstance(result.run_result, Completed)
    expected = {"amount": "99.5", "reason": "late", "refund_on": "2026-12-24"}
    assert seen_payloads == [expected]  # cleaned: unknown keys gone, JSON-safe values
    assert result.run_result.final_state["payload"] == expected
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.payload == expected
    assert approval.events.get(action="approved").payload == expected


def test_an_invalid_payload_is_refused_with_the_form_errors(typed: Any, alice: User) -> None:
    approval = pending(typed)
    for payload, fields in [
        ({"amount": "500", "reason": "late"}, {"amount"}),  # over the order's total
        ({"amount": "x", "reason": "bored"}, {"amount", "reason"}),
        (None, {"amount", "reason"}),
        ({"amount": {"nested": [1]}, "reason": ["late"]}, {"amount", "reason"}),
    ]:
        with pytest.raises(ApprovalFormError) as caught:
            approve(approval.pk, alice, payload=payload)
        assert set(caught.value.errors) == fields, payload
        assert caught.value.code == "approval_payload_invalid"
        assert isinstance(caught.value, ApprovalError | ValueError)
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.payload is None
    assert list(approval.events.values_list("action", flat=True)) == ["requested"]
    with pytest.raises(ApprovalFormError) as caught:
        approve(approval.pk, alice, payload={"amount": "120.01", "reason": "late"})
    assert caught.value.errors == {"amount": ["At most the order's total, 120.00."]}


def test_a_rejection_needs_no_form(typed: Any, alice: User) -> None:
    approval = pending(typed)
    result = reject(approval.pk, alice, payload={"why": "no receipt"})
    assert seen_payloads == [{"why": "no receipt"}]
    assert result.run_result.final_state["outcome"] == "rejected"


def test_the_form_is_checked_when_the_step_asks() -> None:
    assert await_approval({}, form=RefundDecisionForm).form == FORM_PATH
    assert await_approval({}, form=FORM_PATH, initial={"amount": 1}).form_initial == {"amount": 1}
    local = type("Local", (forms.Form,), {"__module__": __name__})
    for form, error in [
        (int, TypeError),
        (RefundDecisionForm(), TypeError),
        (42, TypeError),
        ("tests.testapp.forms.NotAForm", ValueError),
        ("tests.testapp.forms.NeedsAnOrderForm", ValueError),
        ("os.system", ValueError),
        ("no.such.module.Form", ValueError),
        ("not a path", ValueError),
        ("a" * 300 + ".Form", ValueError),
        ("tests.testapp.forms.Refund\x00", ValueError),
        (local, ValueError),  # not importable at its path
    ]:
        with pytest.raises(error):
            await_approval({}, form=form)
    for initial, error in [
        ([1], TypeError),
        ({"a": float("nan")}, ValueError),
        ({"a": "\x00"}, ValueError),
        ({"a": "x" * 70_000}, ValueError),
    ]:
        with pytest.raises(error):
            await_approval({}, form=RefundDecisionForm, initial=initial)
    with pytest.raises(ValueError):
        await_approval({}, initial={"amount": 1})  # initial without a form


def test_a_form_that_no_longer_imports(typed: Any, alice: User) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form="tests.testapp.forms.GoneForm")
    with pytest.raises(ApprovalFormUnavailableError):
        approve(approval.pk, alice, payload={"amount": "1", "reason": "late"})
    errors = check_approval_forms(databases=None)
    assert [e.id for e in errors] == ["flowwarden_django.E211"]
    assert errors[0].level == checks.ERROR and "GoneForm" in errors[0].msg
    approval.refresh_from_db()
    described = describe_form(approval)
    assert described["fields"] == [] and "GoneForm" in described["error"]
    reject(approval.pk, alice)  # rejecting still works
    assert check_approval_forms(databases=None) == []


def test_a_form_that_cannot_be_made_is_unavailable(typed: Any, alice: User) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form="tests.testapp.forms.NeedsAnOrderForm")
    approval.refresh_from_db()
    assert "cannot be made" in describe_form(approval)["error"]
    with pytest.raises(ApprovalFormUnavailableError):
        approve(approval.pk, alice, payload={"note": "x"})


def test_the_check_reports_non_forms_and_skips_other_databases(typed: Any) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form="os.system")
    assert [e.id for e in check_approval_forms(databases=None)] == ["flowwarden_django.E211"]
    assert check_approval_forms(databases=[]) == []


def test_the_form_description(typed: Any) -> None:
    described = describe_form(pending(typed))
    assert described["path"] == FORM_PATH and described["error"] == ""
    by_name = {f["name"]: f for f in described["fields"]}
    assert list(by_name) == ["amount", "reason", "refund_on"]
    assert by_name["amount"]["type"] == "DecimalField" and by_name["amount"]["required"]
    assert by_name["amount"]["initial"] == "120.00"
    assert by_name["reason"]["choices"][1] == {"value": "late", "label": "Arrived late"}
    assert by_name["reason"]["help_text"] == "Why the refund is granted."
    assert by_name["refund_on"]["label"] == "Refund date" and not by_name["refund_on"]["required"]
    assert by_name["refund_on"]["choices"] is None
    assert describe_form(Approval(form="")) is None


def test_json_safe() -> None:
    key = uuid.uuid4()
    group = Group(pk=3, name="g")
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert json_safe(
        {
            "d": decimal.Decimal("1.10"),
            "t": when,
            "day": when.date(),
            "dt": datetime.timedelta(hours=1),
            "u": key,
            "m": group,
            "s": (1, 2),
            "n": None,
        }
    ) == {
        "d": "1.10",
        "t": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "dt": "P0DT01H00M00S",
        "u": str(key),
        "m": 3,
        "s": [1, 2],
        "n": None,
    }


def test_manage_py_check_reports_the_form(typed: Any) -> None:
    approval = pending(typed)
    call_command("check", databases=["default"])  # loads: nothing to say
    Approval.objects.filter(pk=approval.pk).update(form="tests.testapp.forms.GoneForm")
    with pytest.raises(SystemCheckError, match="E211"):
        call_command("check", databases=["default"])


def test_the_sweep_restores_a_lost_typed_approval_with_its_form(typed: Any) -> None:
    lost = pending(typed)
    Approval.objects.filter(pk=lost.pk).delete()  # as if the process died before the row
    assert sweep_approvals(using="default").restored == [lost.coordination_id]
    restored = Approval.objects.get(coordination_id=lost.coordination_id)
    assert restored.form == FORM_PATH and restored.form_initial == lost.form_initial


def test_the_same_approval_again_keeps_the_first_cleaned_data(typed: Any, alice: User) -> None:
    approval = pending(typed)
    first = approve(approval.pk, alice, payload={"amount": "10", "reason": "late"})
    again = approve(approval.pk, alice, payload={"amount": "11", "reason": "late"})
    assert again.repeated and not first.repeated
    approval.refresh_from_db()
    assert approval.payload == {"amount": "10", "reason": "late", "refund_on": None}
