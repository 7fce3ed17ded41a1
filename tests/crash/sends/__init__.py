"""Helpers of the message crash test (``tests/streams/test_message_crash.py``).

A Django app of its own, so that its processes register only its stream and workflow:

* ``settings`` configures the consumer and the sweeper subprocesses
  (``tests.crash.settings`` with this app instead of ``tests.crash``, short workflow
  leases and a quick recovery sweep);
* ``streams`` declares ``crash-sends``, the transactional stream on ``app.orders``
  (fed by ``tests/crash/server.py``) whose handler sends one message per insert;
* ``flows`` holds the ``crash-paid`` workflow's steps and ``define(using)``, which
  ``workflows`` calls in those processes (on ``default``) and the test calls itself
  (on its ``postgres`` alias, the same database) to start the runs.

The test process imports only this module's constants and ``flows``: importing
``streams`` would register the stream in the test process too.
"""

#: The stream, and the workflow whose runs it sends to.
STREAM = "crash-sends"
WORKFLOW = "crash-paid"
#: The topic each run waits for, and the sender the handler names.
TOPIC, SENDER = "paid", "crash-sends"
#: ``parallel`` mode: handler calls at once, and the keys the orders are spread over.
PARALLELISM, KEYS = 4, 8
#: The first key of the advisory locks the handler takes after sending for a gated
#: order (``pg_advisory_xact_lock(GATE_LOCK, seq)``); the test holds them, so the
#: handler blocks there with its message sent and nothing committed.
GATE_LOCK = 47_005


def coordination_id(seq: int) -> str:
    """The run order *seq*'s change event sends its message to."""
    return f"crash-paid-{seq:04d}"
