"""The Celery app of ``bench/workflow_providers.py``, shaped like a project's
``proj/celery.py``: configured from the Django settings (``bench.providers_settings``
in the worker, the benchmark's own ``settings.configure`` in the benchmark process,
which publishes the step tasks with it) and autodiscovering the task modules
(``flowwarden_django.tasks`` holds the workflow step task).

The worker prints :data:`READY_LINE` once it consumes: the benchmark waits for it.
"""

from celery import Celery
from celery.signals import worker_ready

READY_LINE = "flowwarden bench: celery worker ready"

app = Celery("fw-bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _announce(**kwargs: object) -> None:
    print(READY_LINE, flush=True)
