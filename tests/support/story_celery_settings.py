"""Settings of the sample's story on PostgreSQL, Celery and Redis
(``tests/sample/test_story_celery.py``): ``tests/support/story_settings.py``, plus

* workflow steps run on Celery (``WORKFLOW_EXECUTION = "celery"``), one task each;
* the broker is Redis db :data:`BROKER_DB` on ``FLOWWARDEN_TEST_REDIS``, on the
  queue ``FLOWWARDEN_STORY_QUEUE`` of this test run alone.
"""

import os

from tests.support.story_settings import *  # noqa: F403
from tests.support.story_settings import FLOWWARDEN, host_port

#: The Redis database of the story's broker (the other tests use 0, 14 and 15).
BROKER_DB = 13


def transport_options(queue: str) -> dict[str, str]:
    """The Redis transport options of *queue*: its unacked-message keys are named after
    it, so that the test can delete everything the run left in Redis."""
    return {
        "unacked_key": f"{queue}-unacked",
        "unacked_index_key": f"{queue}-unacked-index",
        "unacked_mutex_key": f"{queue}-unacked-mutex",
    }


_redis_host, _redis_port = host_port("FLOWWARDEN_TEST_REDIS", 6379)

FLOWWARDEN = {**FLOWWARDEN, "WORKFLOW_EXECUTION": "celery"}

CELERY_BROKER_URL = f"redis://{_redis_host}:{_redis_port}/{BROKER_DB}"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FLOWWARDEN_STORY_QUEUE", "fw-story")
CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(CELERY_TASK_DEFAULT_QUEUE)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No remote control: nothing of the worker is left in Redis after it stops.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False

# As a project's ``proj/__init__.py`` does (``from .celery import app``): every Django
# process loads the Celery app, so the stream runner and the web server publish the
# workflow steps with it (``celery.current_app``), not with Celery's default app.
from tests.support.story_celery_app import app as celery_app  # noqa: E402, F401
