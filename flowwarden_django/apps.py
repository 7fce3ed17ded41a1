"""App configuration."""

from django.apps import AppConfig


class FlowwardenConfig(AppConfig):
    """Connects the system checks and the settings-reload signal; nothing else at start-up."""

    name = "flowwarden_django"
    verbose_name = "Flowwarden"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, signals  # noqa: F401  (registers checks and receivers)
