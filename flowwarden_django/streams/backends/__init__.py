"""Checkpoint store backends: memory, orm, redis, mongo."""
