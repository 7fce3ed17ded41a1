"""The tests of the ``SnapshotStore`` contract, one mixin per concern; the public
``flowwarden_django.testkit.snapshot_store`` composes them into
``SnapshotStoreContract`` (import it from there, or from ``flowwarden_django.testkit``).
"""
