"""Integrations with other systems: Celery (workers, tasks, the execution provider),
Temporal (the execution provider and its worker) and Prometheus (the metrics
exporter). Each sits on the core, never the other way round."""
