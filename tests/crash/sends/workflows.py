"""The consumer's and the sweeper's ``crash-paid`` workflow, on their ``default``
database (discovered at start-up, like any app's ``workflows`` module)."""

from tests.crash.sends.flows import define

define("default")
