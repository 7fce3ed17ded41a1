"""Helpers of the crash test (``tests/streams/test_crash.py``).

``settings`` configures the consumer subprocess, ``streams`` declares the stream it
runs and ``server`` is the scripted MongoDB the test feeds on demand. Nothing here
is imported by the test process itself except ``server``'s constants.

``copy_sync`` holds the same three pieces for the initial-sync crash test
(``tests/streams/test_initial_sync_crash.py``), as an app of its own.
"""
