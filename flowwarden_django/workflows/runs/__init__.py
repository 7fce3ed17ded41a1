"""Run records: the ``WorkflowRun`` row of each run (its status, head, claim and
lease), how it is claimed, updated and released (``records``), and the write
transaction both halves of a step's save share (``transactions``).

Until 0.3 this package also serves, with a warning, the names the 0.1.0 module
``flowwarden_django.workflows.runs`` held.
"""

from ...common.deprecation import moved_module

__getattr__ = moved_module(__name__, "flowwarden_django.workflows.runs.records")
