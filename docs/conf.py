"""Sphinx configuration of flowwarden-django's documentation (``make docs``).

The pages are Markdown (MyST); the API reference is autodoc, which imports the
package, so Django is set up first with the sample project's settings.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sampleproject.settings")

import django  # noqa: E402

django.setup()

from flowwarden_django import __version__  # noqa: E402

project = "flowwarden-django"
author = "the flowwarden-django developers"
copyright = "2026, " + author
release = version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "none"
html_theme = "alabaster"
html_title = f"flowwarden-django {release}"
