"""Helpers both halves of the app share (streams and workflows); nothing here
imports the admin, the API or an integration."""
