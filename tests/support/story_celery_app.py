"""The Celery app of the sample's story: ``celery -A tests.support.story_celery_app worker``.

Shaped like a project's ``proj/celery.py``: configured from the Django settings
(``tests.support.story_celery_settings``, which also imports this module, as a project's package
does) and autodiscovering the installed apps' task modules, which registers
``flowwarden_django.run_workflow_step``.
"""

import os

from celery import Celery

# Before the app exists: Celery installs its Django fix-up only when this is set.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.story_celery_settings")

app = Celery("fw-story")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
