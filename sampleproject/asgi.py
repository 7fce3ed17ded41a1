"""The sample project served through ASGI: ``uvicorn sampleproject.asgi:application``
(or any ASGI server); the shop's async views (``shop/views.py``) run in its event loop."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sampleproject.settings")

application = get_asgi_application()
