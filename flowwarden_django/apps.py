"""App configuration."""

from django.apps import AppConfig


class FlowwardenConfig(AppConfig):
    """Connects the system checks and the settings-reload signal, and imports each
    installed app's ``streams`` module; nothing else at start-up."""

    name = "flowwarden_django"
    verbose_name = "Flowwarden"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks, signals  # noqa: F401  (registers checks and receivers)

        # Streams declared in each installed app's streams.py register themselves.
        autodiscover_modules("streams")
