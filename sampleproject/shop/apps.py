from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The sample shop."""

    name = "sampleproject.shop"
    label = "shop"
