"""Where and how a step runs, below the step loop: the execution providers
(``providers``: the SPI, in-process, and the remote providers' base), the claim keeper
that renews the claims a process holds (``claim_keeper``), hand-offs from step to step
(``handoff``), releases that wait for the database (``releases``) and step timings
(``step_timings``).

Until 0.3 this package also serves, with a warning, the names the 0.1.0 module
``flowwarden_django.workflows.execution`` held (now ``execution.providers``).
"""

from ...common.deprecation import moved_module

__getattr__ = moved_module(__name__, "flowwarden_django.workflows.execution.providers")
