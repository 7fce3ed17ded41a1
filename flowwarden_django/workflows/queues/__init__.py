"""Workflow queues: concurrency, rate, priority and per-key partitions for the steps of
a workflow's runs, on every execution provider (``FLOWWARDEN["WORKFLOW_QUEUES"]``).

* ``settings``: the queues as configured (``QueueConfig``, ``queue_config``).
* ``slots``: the ``WorkflowQueueSlot`` rows that hold a queue's capacity, taken and
  given back by conditional statements.
* ``gate``: the engine's admission of each step (``StepGate``): a slot, or the run
  waits (``waiting_slot``) holding nothing.
* ``dispatch``: handing free slots to the waiting runs, in priority then arrival
  order, and the timer that does it when a rate frees up or a dead holder's lease
  runs out.
* ``stats``: what each queue holds and waits for (the command, the admin, metrics,
  health).
* ``health``: the queues' part of ``/flowwarden/health/`` (stale queues).
"""
