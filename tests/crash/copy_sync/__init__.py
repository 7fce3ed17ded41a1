"""Helpers of the initial-sync crash test (``tests/streams/test_initial_sync_crash.py``).

A Django app of its own, so that the consumer subprocess registers only its streams:

* ``settings`` configures the consumer subprocess (``tests.crash.settings`` with this
  app instead of ``tests.crash``);
* ``streams`` declares the two ``COPY_EXISTING`` streams it runs on ``app.docs``;
* ``server`` is the scripted MongoDB, seeded with the existing documents and driven
  over its stdin (writes, gates that hold a request at a chosen point of the copy).

The test process imports only the constants below: importing ``streams`` would
register its streams in the test process too.
"""

DATABASE, COLLECTION = "app", "docs"
#: The non-transactional stream (a batch cut short by a kill is copied again).
STREAM = "copy-mirror"
#: The transactional stream (a batch commits with its progress write, or not at all).
TRANSACTIONAL_STREAM = "copy-mirror-tx"
#: ``Effect.stream`` of the row each copied document writes.
SNAPSHOT = "snapshot"
#: The gates of ``server`` (see its docstring).
GATES = ("bootstrap", "empty-find", "resume")
