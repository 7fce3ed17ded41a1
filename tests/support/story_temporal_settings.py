"""Settings of the sample's story on PostgreSQL and Temporal
(``tests/sample/test_story_temporal.py``): ``tests/support/story_settings.py``, plus

* workflows run on Temporal (``WORKFLOW_EXECUTION = "temporal"``): each run one
  Temporal workflow, each step one activity in ``manage.py flowwarden_temporal_worker``;
* the server is ``FLOWWARDEN_TEMPORAL_TARGET`` (the dev server the test starts), the
  task queue ``FLOWWARDEN_STORY_QUEUE`` (of this test run alone).
"""

import os

from tests.support.story_settings import *  # noqa: F403
from tests.support.story_settings import FLOWWARDEN

FLOWWARDEN = {
    **FLOWWARDEN,
    "WORKFLOW_EXECUTION": "temporal",
    "TEMPORAL": {
        "TARGET": os.environ.get("FLOWWARDEN_TEMPORAL_TARGET", "127.0.0.1:7233"),
        "TASK_QUEUE": os.environ.get("FLOWWARDEN_STORY_QUEUE", "fw-story"),
        "HEARTBEAT_TIMEOUT": "2s",
    },
}
