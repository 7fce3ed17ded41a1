"""For tests of what sweeps, lists or checks every database a defined workflow keeps
its runs in (the commands, the system checks): a workflow another test module
defined on a database this test may not use (the ``postgres`` alias, say, left
registered) is hidden while the test runs, and put back afterwards. A conftest
imports the fixture to apply it to its folder."""

from collections.abc import Iterator

import pytest

from flowwarden_django.workflows import workflow_registry
from flowwarden_django.workflows.runs.records import RunRecords


@pytest.fixture(autouse=True)
def _only_workflows_of_this_tests_databases(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("django_db")
    databases = (marker.kwargs.get("databases") if marker else None) or ["default"]
    if databases == "__all__" or "__all__" in databases:
        yield
        return
    hidden = []
    for name in workflow_registry.names():
        for version in workflow_registry.versions(name):
            definition = workflow_registry.get(name, version)
            if RunRecords(definition.using).db not in databases:
                hidden.append(definition)
                workflow_registry.unregister(name, version)
    try:
        yield
    finally:
        for definition in hidden:
            if _version_free(definition):
                workflow_registry.register(definition)


def _version_free(definition: object) -> bool:
    """Whether no definition of the same name and version was made meanwhile."""
    name, version = definition.name, definition.version  # type: ignore[attr-defined]
    return name not in workflow_registry or version not in workflow_registry.versions(name)
