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

The other tags draw the pieces the app's admin pages repeat, as the Django admin draws
them: ``{% column_heads %}`` a table's column heads, ``{% object_tool %}`` a link of the
object tools, ``{{ when|exact_time }}`` a time to the second, ``{% textarea_row %}`` an
aligned fieldset's text area, ``{% confirmation_inputs %}`` and ``{% submit_row %}`` the
hidden inputs and the buttons of a confirmation form.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import django
from django import template
from django.template.base import NodeList, Parser, Token
from django.template.defaultfilters import date as date_filter
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


@register.simple_tag
def column_heads(*heads: str) -> SafeString:
    """``<th scope="col">`` for each of *heads*: ``{% column_heads _("Name") _("Status") %}``."""
    return format_html_join("", '<th scope="col">{}</th>', ((head,) for head in heads))


@register.simple_tag
def object_tool(url: str, label: str, css_class: str = "") -> SafeString | str:
    """One ``<li>`` of ``<ul class="object-tools">`` linking *url*, or nothing without one."""
    if not url:
        return ""
    if css_class:
        return format_html('<li><a href="{}" class="{}">{}</a></li>', url, css_class, label)
    return format_html('<li><a href="{}">{}</a></li>', url, label)


@register.filter(expects_localtime=True)
def exact_time(value: datetime | None) -> SafeString:
    """*value* to the second in a ``<time>`` element (``YYYY-mm-dd HH:MM:SS``)."""
    return format_html(
        '<time datetime="{}">{}</time>', date_filter(value, "c"), date_filter(value, "Y-m-d H:i:s")
    )


@register.inclusion_tag("admin/flowwarden_django/textarea_row.html")
def textarea_row(
    name: str,
    label: str,
    value: Any,
    *,
    rows: int,
    cols: int = 60,
    help_text: str = "",
    error: str | None = None,
    maxlength: int | None = None,
    json: bool = False,
    required: bool = False,
) -> dict[str, Any]:
    """A text area named *name* as a row of an aligned fieldset: its error, label and help;
    a *json* one does not spell-check and points at its error."""
    return {
        "name": name,
        "label": label,
        "value": value,
        "rows": rows,
        "cols": cols,
        "help": help_text,
        "error": error,
        "maxlength": maxlength,
        "json": json,
        "required": required,
    }


@register.inclusion_tag("admin/flowwarden_django/confirmation_inputs.html", takes_context=True)
def confirmation_inputs(context: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The hidden inputs of a confirmation page's form: when it confirms the admin action
    ``action_name``, the selected objects (``row[key]`` of each of ``rows``) and the action;
    always ``post=yes``."""
    action_name = context.get("action_name")
    return {
        "action_name": action_name,
        "checkbox_name": context.get("action_checkbox_name"),
        "pks": [row[key].pk for row in context.get("rows", ())] if action_name else [],
    }


@register.inclusion_tag("admin/flowwarden_django/submit_row.html")
def submit_row(
    button: str,
    cancel_url: str,
    cancel_label: str = "",
    *,
    enabled: Any = True,
    disabled: Any = False,
) -> dict[str, Any]:
    """The admin's submit row: the *button* (disabled when *enabled* is falsy or *disabled*
    truthy) and a link back to *cancel_url* ("No, take me back" unless *cancel_label*)."""
    return {
        "button": button,
        "cancel_url": cancel_url,
        "cancel_label": cancel_label,
        "disabled": disabled or not enabled,
    }
