"""The engine: the ``Workflow`` facade and ``WorkflowDefinition`` (``workflow``),
opening a run (``opening``), the step loop (``loop``) and what it writes (``saving``),
calling a step (``calling``) and starting a run (``starting``). It sits on top of the
other workflow packages; none of them imports it.

Until 0.3 this package also serves, with a warning, the names the 0.1.0 module
``flowwarden_django.workflows.engine`` held (see CHANGELOG.md).
"""

from ...common.deprecation import moved_module

#: The names of the 0.1.0 module ``engine.py``, where each is now.
__getattr__ = moved_module(
    __name__,
    None,
    {
        "Workflow": "flowwarden_django.workflows.engine.workflow",
        "WorkflowDefinition": "flowwarden_django.workflows.engine.workflow",
        "StepAttemptFailed": "flowwarden_django.workflows.engine.calling",
        "StepTimeoutError": "flowwarden_django.workflows.engine.calling",
        "LAST_STEP": "flowwarden_django.workflows.definition.metadata",
        "WORKFLOW_DONE": "flowwarden_django.workflows.definition.metadata",
        "WORKFLOW_NAME": "flowwarden_django.workflows.definition.metadata",
        "Completed": "flowwarden_django.workflows.definition.results",
        "Failed": "flowwarden_django.workflows.definition.results",
        "Hibernated": "flowwarden_django.workflows.definition.results",
        "NeedsUpgrade": "flowwarden_django.workflows.definition.results",
        "Running": "flowwarden_django.workflows.definition.results",
        "StartedRun": "flowwarden_django.workflows.definition.results",
        "WorkflowResult": "flowwarden_django.workflows.definition.results",
        "WorkflowRegistry": "flowwarden_django.workflows.definition.registry",
        "workflow_registry": "flowwarden_django.workflows.definition.registry",
    },
)
