"""``{{ value|moment }}``: a time as the inbox shows it, in words ("in 2 hours",
"3 days ago") inside ``<time datetime="...">`` with the exact local time as its
title; ``—`` for none::

    {% load flowwarden_inbox %}
    {{ approval.expires_at|moment }}

and ``{% column_heads %}`` of ``flowwarden_admin``, for the inbox's tables.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..common.formatting import NONE_TEXT, relative_time
from .flowwarden_admin import column_heads

register = template.Library()
register.simple_tag(column_heads)


@register.filter
def moment(value: datetime | None) -> SafeString | str:
    """*value* in words, its exact time in the ``<time>`` element's title."""
    if not isinstance(value, datetime):
        return NONE_TEXT
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    exact = formats.date_format(local, "DATETIME_FORMAT")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), exact, relative_time(value)
    )
