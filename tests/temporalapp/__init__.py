"""A test app whose ``workflows.py`` defines the Temporal test workflows in the worker."""
