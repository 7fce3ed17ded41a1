"""Template tags of the package's admin and inbox pages."""
