"""Signal receivers of the app."""

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import SETTING_NAME, fw_settings


@receiver(setting_changed)
def reload_flowwarden_settings(*, setting: str, **kwargs: object) -> None:
    """Drop cached settings and configured stores when ``FLOWWARDEN`` changes."""
    if setting != SETTING_NAME:
        return
    fw_settings.reload()
    from .streams.clients import mongo_clients
    from .streams.stores import checkpoint_stores, dlq_stores, lock_services
    from .workflows.storage.store import snapshot_stores

    checkpoint_stores.reset()
    dlq_stores.reset()
    lock_services.reset()
    snapshot_stores.reset()
    mongo_clients.reset()
