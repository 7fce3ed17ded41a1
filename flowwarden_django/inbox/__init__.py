"""The approver's inbox: pages for the people an approval is for, staff or not.

``path("approvals/", include("flowwarden_django.inbox.urls"))`` gives:

* ``login/`` and ``logout/``: Django's own authentication views;
* ``""``: "my approvals", the approvals the user may decide (pending by default),
  filterable by status, claim, workflow and "overdue", searchable by prompt or run,
  with their due and escalation times;
* ``bulk/``: approve or reject the selected approvals (``bulk``), each through the
  same core call, never one with a decision form;
* ``<id>/``: one approval: the request, the paused run's state, and for a user who
  may decide it, approve or reject with a comment and a JSON payload, through the
  same core (``workflows.approvals.decide``: its validator, permission rules and
  audit) as the API and the admin.

The pages look like the Django admin (they extend its templates), so
``django.contrib.admin`` must be installed, but they need no staff status.
"""
