"""App configuration."""

from importlib.util import find_spec

from django.apps import AppConfig


class FlowwardenConfig(AppConfig):
    """Connects the system checks and the settings-reload signal, imports each
    installed app's ``streams`` and ``workflows`` modules, and connects the Prometheus counters when
    prometheus-client is installed; nothing else at start-up."""

    name = "flowwarden_django"
    verbose_name = "Flowwarden"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks, signals  # noqa: F401  (registers checks and receivers)

        # Streams declared in each installed app's streams.py register themselves.
        autodiscover_modules("streams")
        # So are workflows defined in workflows.py (Workflow.define), in every process:
        # the web process deciding an approval and the worker running the steps.
        autodiscover_modules("workflows")
        if find_spec("prometheus_client") is not None:
            # Count the metric signals of this process's streams (the exporter's
            # counters); the gauges are read from the database at scrape time.
            from .integrations import prometheus  # noqa: F401
