"""A small shop project that shows flowwarden-django on embedded defaults (SQLite)."""
