"""Tests of the promises of ``docs/security.md`` across the API, the admin, the inbox and
the commands: the hostile-input suite and the hardening review's regression tests."""
