"""The tests of the ``CheckpointStore`` contract, one mixin per concern; the public
``flowwarden_django.testkit.checkpoint_store`` composes them into
``CheckpointStoreContract`` (import it from there, or from ``flowwarden_django.testkit``).
"""
