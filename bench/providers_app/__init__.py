"""The app of ``bench/workflow_providers.py``: its ``workflows.py`` defines the benchmark
workflow in every process that installs it (the benchmark itself, the Celery worker and
the Temporal worker), found by flowwarden's autodiscovery as a project's would be."""
