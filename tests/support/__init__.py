"""Helpers shared by the tests: server lanes, processes, browsers, and the settings,
Celery apps and workflows that worker subprocesses import by dotted path."""
