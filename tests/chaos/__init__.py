"""Chaos tests (issue 17, "Resilience to infrastructure faults").

They restart database and broker servers under load, so they run against private
servers of their own (:mod:`tests.chaos.servers`), never the shared ones on the
standard ports. ``tests/chaos/conftest.py`` holds their fixtures and the ``chaos``
marker.
"""
