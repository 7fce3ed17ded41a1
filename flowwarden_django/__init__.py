"""flowwarden-django: durable change-stream consumers and durable workflows for Django."""

__version__ = "0.1.0"
