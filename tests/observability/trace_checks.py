"""What the cross-process tracing tests check of one run's spans."""

from __future__ import annotations

from typing import Any


def assert_one_trace(
    spans: list[dict[str, Any]], request: dict[str, Any], cid: str, steps: list[str]
) -> None:
    """*spans* (the test process's and the worker's) are one trace under *request*: a
    ``flowwarden.workflow.run`` span per execution of run *cid*, each the request's
    child, and one ``flowwarden.workflow.step`` span per attempt of *steps*, each the
    child of a run span, with their attributes."""
    mine = [
        span
        for span in spans
        if span["attributes"].get("flowwarden.coordination_id") == cid or span is request
    ]
    assert {span["trace_id"] for span in mine} == {request["trace_id"]}
    runs = [span for span in mine if span["name"] == "flowwarden.workflow.run"]
    assert runs and {run["parent_id"] for run in runs} == {request["span_id"]}
    for run in runs:
        assert run["attributes"]["flowwarden.workflow.version"] == 1
    step_spans = [span for span in mine if span["name"] == "flowwarden.workflow.step"]
    assert [span["attributes"]["flowwarden.step"] for span in step_spans] == steps
    assert {span["parent_id"] for span in step_spans} <= {run["span_id"] for run in runs}
    for span in step_spans:
        assert span["attributes"]["flowwarden.attempt"] == 1
        assert span["attributes"]["flowwarden.coordination_id"] == cid
