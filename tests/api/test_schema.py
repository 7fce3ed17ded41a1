"""The REST API's OpenAPI schema, and a bounded Schemathesis run against it."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import schemathesis
import yaml
from django.core.handlers.wsgi import WSGIHandler
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.settings import patched_settings
from drf_spectacular.validation import validate_schema
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from flowwarden_django.api.enum_overrides import own_enum_overrides
from flowwarden_django.api.views import SchemaView
from flowwarden_django.workflows import Workflow, workflow_registry
from tests.api.helpers import (
    API,
    make_people,
    pending,
    post_json,
    postgres_lane,
    token_client,
)
from tests.support.payments_workflow import define_payments

pytest_plugins = ["tests.api.helpers"]  # the people and refunds fixtures
pytestmark = pytest.mark.django_db(transaction=True)

OPERATIONS = {
    "api_root": ("GET", f"{API}/"),
    "runs_list": ("GET", f"{API}/runs/"),
    "runs_retrieve": ("GET", f"{API}/runs/{{coordination_id}}/"),
    "snapshots_list": ("GET", f"{API}/snapshots/"),
    "snapshots_retrieve": ("GET", f"{API}/snapshots/{{id}}/"),
    "snapshots_fork": ("POST", f"{API}/snapshots/{{id}}/fork/"),
    "approvals_list": ("GET", f"{API}/approvals/"),
    "approvals_mine": ("GET", f"{API}/approvals/mine/"),
    "approvals_retrieve": ("GET", f"{API}/approvals/{{id}}/"),
    "approvals_approve": ("POST", f"{API}/approvals/{{id}}/approve/"),
    "approvals_reject": ("POST", f"{API}/approvals/{{id}}/reject/"),
    "approvals_claim": ("POST", f"{API}/approvals/{{id}}/claim/"),
    "approvals_release": ("POST", f"{API}/approvals/{{id}}/release/"),
    "approvals_reassign": ("POST", f"{API}/approvals/{{id}}/reassign/"),
    "schema_retrieve": ("GET", f"{API}/schema/"),
    "token_create": ("POST", f"{API}/token/"),
    "runs_cancel": ("POST", f"{API}/runs/{{coordination_id}}/cancel/"),
    "runs_messages_list": ("GET", f"{API}/runs/{{coordination_id}}/messages/"),
    "runs_messages_create": ("POST", f"{API}/runs/{{coordination_id}}/messages/"),
    "runs_events_list": ("GET", f"{API}/runs/{{coordination_id}}/events/"),
}
#: The operations open to anyone (no 401): the schema and the token exchange.
OPEN = {"schema_retrieve", "token_create"}


def served_schema(client: Any) -> dict[str, Any]:
    response = client.get(f"{API}/schema/?format=json")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return response.json()


def test_the_served_schema(people: Any) -> None:
    schema = served_schema(token_client(people.carol))
    validate_schema(schema)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "flowwarden-django API"
    found = {
        op["operationId"]: (method.upper(), path)
        for path, item in schema["paths"].items()
        for method, op in item.items()
    }
    assert found == OPERATIONS
    assert set(schema["components"]["securitySchemes"]) == {"tokenAuth", "basicAuth", "cookieAuth"}
    # YAML by default, the same document.
    text = token_client(people.carol).get(f"{API}/schema/").content.decode()
    assert yaml.safe_load(text)["paths"].keys() == schema["paths"].keys()


def test_error_responses_are_described(people: Any) -> None:
    schema = served_schema(token_client(people.carol))
    error = {"$ref": "#/components/schemas/Error"}
    for path, item in schema["paths"].items():
        for method, op in item.items():
            responses = op["responses"]
            if op["operationId"] in OPEN:
                assert "401" not in responses, op["operationId"]
                continue
            media = next(iter(responses["401"]["content"].values()))
            assert media["schema"] == error, (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            if method == "post":
                assert {"400", "403", "404"} <= set(responses), path
    approve = schema["paths"][f"{API}/approvals/{{id}}/approve/"]["post"]["responses"]
    for status in ("403", "404", "409", "410"):
        assert approve[status]["content"]["application/json"]["schema"] == error
    bad = approve["400"]["content"]["application/json"]["schema"]
    assert bad["type"] == "object" and "oneOf" in bad["additionalProperties"]
    approval = schema["paths"][f"{API}/approvals/{{id}}/"]["get"]["parameters"][0]
    assert approval["schema"] == {"type": "string", "format": "uuid"}


def test_the_schema_generates_without_warnings() -> None:
    GENERATOR_STATS.reset()
    with own_enum_overrides(), patched_settings(SchemaView.custom_settings):
        schema = SchemaGenerator().get_schema(request=None, public=True)
    assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache, (
        GENERATOR_STATS._warn_cache,
        GENERATOR_STATS._error_cache,
    )
    assert all(path.startswith("/api/v1/") for path in schema["paths"])


def test_the_served_enum_names_do_not_depend_on_a_schema_generated_before(people: Any) -> None:
    """drf-spectacular keeps the first ``ENUM_NAME_OVERRIDES`` it reads for the whole
    process (tfranzel/drf-spectacular#1244): the project's own schema, generated
    first with its settings, must not rename this API's enums, and this API's
    overrides must not stay behind for the project's next schema."""
    client = token_client(people.carol)

    def status_enums(schema: dict[str, Any]) -> set[str]:
        names = schema["components"]["schemas"]
        return {name for name in names if "Status" in name and name.endswith("Enum")}

    SchemaGenerator().get_schema(request=None, public=True)  # the project's, first
    assert status_enums(served_schema(client)) == {"RunStatusEnum", "ApprovalStatusEnum"}
    GENERATOR_STATS.reset()
    project = SchemaGenerator().get_schema(request=None, public=True)
    assert "RunStatusEnum" not in status_enums(project)  # the project set no overrides
    assert status_enums(served_schema(client)) == {"RunStatusEnum", "ApprovalStatusEnum"}


def test_without_the_cache_the_schema_is_made_as_it_is(monkeypatch: Any) -> None:
    """A drf-spectacular release without the process-wide cache: nothing to forget."""
    from drf_spectacular import plumbing

    def load(language: str) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(plumbing, "_load_enum_name_overrides", load)
    ran = []
    with own_enum_overrides():
        ran.append(True)
    assert ran == [True]


# -- Schemathesis ----------------------------------------------------------------------

#: Examples per operation and generation mode (and once more per real path id).
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 15}
KNOWN_IDS_EXAMPLES = 15
#: No 5xx, and every response as the schema describes it (status, media type, body).
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.parametrize("lane", [pytest.param("sqlite", id="sqlite"), postgres_lane()])
@pytest.mark.slow  # a fuzzing run: hundreds of generated requests
def test_schemathesis_finds_no_server_errors(
    lane: str, on_lane: None, refunds: Any, capsys: Any
) -> None:
    people = make_people()
    waiting = pending(refunds)  # a waiting run with a pending approval
    decided = pending(refunds)
    completed = refunds.start({"amount": 5}).coordination_id
    expired = pending(refunds, expires_in=60)
    type(expired).objects.filter(pk=expired.pk).update(expires_at="2000-01-01T00:00:00Z")
    token = Token.objects.create(user=people.admin).key
    auth = {"Authorization": f"Token {token}"}
    rejected = post_json(token_client(people.admin), f"{API}/approvals/{decided.pk}/reject/", {})
    assert rejected.status_code == 200
    seed = Workflow.for_coordination(completed).history()[0]
    payments = define_payments("schema-payments")
    try:
        awaiting = payments.start({}).coordination_id  # waits for a message
    finally:
        workflow_registry.unregister("schema-payments")  # a message is stored, not handled
    known = {
        "coordination_id": [waiting.coordination_id, completed, awaiting],
        "id": {
            "snapshots": [seed.id, waiting.snapshot_id],
            "approvals": [str(waiting.pk), str(decided.pk), str(expired.pk)],
        },
    }

    schema = schemathesis.openapi.from_wsgi(
        f"{API}/schema/?format=json", WSGIHandler(), headers=auth
    )
    statuses: Counter[int] = Counter()
    cases = 0
    labels: set[str] = set()
    skipped: list[str] = []
    started = time.monotonic()

    for result in schema.get_all_operations():
        operation = result.ok()
        labels.add(operation.label)
        runs: list[tuple[Any, int, bool]] = [
            (operation.as_strategy(generation_mode=mode), count, not mode.is_positive)
            for mode, count in EXAMPLES.items()
        ]
        for path_parameters in _known_path_parameters(operation.path, known):
            strategy = operation.as_strategy(path_parameters=path_parameters)
            runs.append((strategy, KNOWN_IDS_EXAMPLES, False))
        for strategy, count, negative in runs:

            @settings(
                max_examples=count,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def exercise(case: Any) -> None:
                nonlocal cases
                cases += 1
                response = case.call_and_validate(headers=auth, checks=CHECKS)
                statuses[response.status_code] += 1

            try:
                exercise()
            except Unsatisfiable:
                if not negative:
                    raise
                skipped.append(operation.label)  # nothing in it can be made invalid

    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\nschemathesis ({lane}): {len(labels)} operations, {cases} cases in {elapsed:.1f}s; "
            f"statuses {dict(sorted(statuses.items()))}; "
            f"no negative cases for {skipped}"
        )
    # Schemathesis leaves out the schema's own operation (tested above).
    assert labels == {f"{method} {path}" for method, path in OPERATIONS.values()} - {
        f"GET {API}/schema/"
    }
    assert not any(status >= 500 for status in statuses)
    assert {200, 201, 400, 404, 409, 410} <= set(statuses)


def _known_path_parameters(path: str, known: dict[str, Any]) -> list[dict[str, str]]:
    """Path parameters naming objects that exist, for *path*'s placeholders."""
    if "{coordination_id}" in path:
        return [{"coordination_id": cid} for cid in known["coordination_id"]]
    if "{id}" in path:
        kind = "snapshots" if "/snapshots/" in path else "approvals"
        return [{"id": value} for value in known["id"][kind]]
    return []
