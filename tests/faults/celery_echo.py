"""The task a partitioned Celery worker answers once its broker is back
(``tests/faults/test_celery_broker_partitions.py``)."""

import os

from celery import shared_task

ECHO_TASK = "tests.faults.echo"


@shared_task(name=ECHO_TASK)
def echo(value: str) -> dict:
    """*value* and the pid of the process that ran it."""
    return {"value": value, "pid": os.getpid()}
