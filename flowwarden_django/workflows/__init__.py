"""The workflow half: durable multi-step workflows stored as parent-linked snapshots.

Nothing in this package imports the admin, DRF or Celery.
"""
