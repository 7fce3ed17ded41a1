"""Run records: the ``WorkflowRun`` row of each run (its status, head, claim and
lease), how it is claimed, updated and released (``records``, with its parts:
``status``, ``errors``, ``leases``, ``rows``, ``statements`` and their ``sql``,
``pauses``), and the write transaction both halves of a step's save share
(``transactions``).

Until 0.3 this package also serves, with a warning, the names the 0.1.0 module
``flowwarden_django.workflows.runs`` held, each from the module that holds it now.
"""

from ...common.deprecation import moved_module

_RUNS = "flowwarden_django.workflows.runs"

__getattr__ = moved_module(
    __name__,
    f"{_RUNS}.records",
    {
        "RunStatus": f"{_RUNS}.status",
        **dict.fromkeys(
            (
                "ConcurrentRunError",
                "LeaseLostError",
                "RunConflictError",
                "RunVersionError",
                "UnknownRunError",
                "check_run_of",
            ),
            f"{_RUNS}.errors",
        ),
        **dict.fromkeys(
            (
                "HANDOFF_PREFIX",
                "between_steps",
                "new_handoff_token",
                "new_runner_token",
                "recover_after",
                "run_lease",
                "unclaimed",
            ),
            f"{_RUNS}.leases",
        ),
        **dict.fromkeys(("ClaimTerms", "NewRunClaim"), f"{_RUNS}.statements"),
    },
)
