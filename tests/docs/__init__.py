"""Tests of the documentation (``docs/``): the tutorial runs as written, and the README
quotes the figures the docs measured."""
