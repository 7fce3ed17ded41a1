"""``{% breadcrumbs %}``: the admin's breadcrumbs bar as the running Django draws it.

Django 6.1 draws its breadcrumbs as ``<ol class="breadcrumbs">`` with an ``<li>`` per
crumb, and its stylesheet styles nothing else; older versions draw ``<div
class="breadcrumbs">`` with the crumbs joined by ``&rsaquo;``. A custom admin page writes
its crumbs once::

    {% load flowwarden_admin %}
    {% block breadcrumbs %}{% breadcrumbs %}
      <a href="{% url 'admin:index' %}">{% translate 'Home' %}</a>
    {% crumb %}{{ title }}
    {% endbreadcrumbs %}{% endblock %}

and gets the markup (and so the styled bar) of the Django it runs on. The last crumb
is the current page; a crumb that renders empty (``{% crumb %}{% if x %}…{% endif %}``)
is left out.
"""

from __future__ import annotations

from typing import Any

import django
from django import template
from django.template.base import NodeList, Parser, Token
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

#: Whether this Django draws its breadcrumbs as an ordered list (Django 6.1 and later).
ORDERED_BREADCRUMBS = django.VERSION >= (6, 1)


class BreadcrumbsNode(template.Node):
    """The crumbs between ``{% breadcrumbs %}``, ``{% crumb %}`` and ``{% endbreadcrumbs %}``."""

    def __init__(self, crumbs: list[NodeList]) -> None:
        self.crumbs = crumbs

    def render(self, context: Any) -> SafeString:
        rendered = (crumb.render(context).strip() for crumb in self.crumbs)
        crumbs = [mark_safe(crumb) for crumb in rendered if crumb]
        return breadcrumbs_html(crumbs, ordered=ORDERED_BREADCRUMBS)


def breadcrumbs_html(crumbs: list[SafeString], *, ordered: bool) -> SafeString:
    """*crumbs* (HTML, the current page last) as ``<ol class="breadcrumbs">`` when
    *ordered*, else as ``<div class="breadcrumbs">``."""
    if not ordered:
        return format_html(
            '<div class="breadcrumbs">\n{}\n</div>', mark_safe("\n&rsaquo; ".join(crumbs))
        )
    *parents, current = crumbs
    return format_html(
        '<ol class="breadcrumbs">\n{}<li aria-current="page">{}</li>\n</ol>',
        format_html_join("", "<li>{}</li>\n", ((crumb,) for crumb in parents)),
        current,
    )


@register.tag("breadcrumbs")
def do_breadcrumbs(parser: Parser, token: Token) -> BreadcrumbsNode:
    """``{% breadcrumbs %}Home{% crumb %}…{% crumb %}Page{% endbreadcrumbs %}``."""
    crumbs = []
    while True:
        crumbs.append(parser.parse(("crumb", "endbreadcrumbs")))
        if parser.next_token().contents == "endbreadcrumbs":
            return BreadcrumbsNode(crumbs)
