"""The workflows defined on databases a test may not use are hidden while it runs
(``tests.support.registry_scope``)."""

from tests.support.registry_scope import _only_workflows_of_this_tests_databases  # noqa: F401
