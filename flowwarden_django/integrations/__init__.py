"""Integrations with other systems: Celery (workers, tasks, the execution provider)
and Prometheus (the metrics exporter). Each sits on the core and never the other way
round."""
