"""Tests of the package as a whole: its layout and the import paths the docs show,
and the core installed without its optional extras."""
