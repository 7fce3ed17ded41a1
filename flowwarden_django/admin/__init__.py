"""The flowwarden admin: one module per family of pages, registered on import.

* ``checkpoints``: the ORM checkpoint store's rows (read-only);
* ``console``: the streams console (status, pause/resume/restart);
* ``dead_letters``: the dead-letter queue (replay, discard, acknowledge);
* ``runs``: workflow runs with their snapshot trees, diffs and the fork page, made of
  ``run_columns``, ``run_actions``, ``run_snapshot_pages``, ``run_fork``,
  ``run_stores``, ``run_mailbox`` and ``run_texts`` (``snapshots`` builds the tree and
  the diffs);
* ``messages``: messages sent to runs and the events runs publish (read-only);
* ``approvals``: approvals and their audit trail, with approve/reject pages.
* ``workflows_page``: the "Workflows" page (every defined workflow, its runs by
  status) and each version's diagram (built by ``diagram``); a run's page draws its
  timeline (built by ``timeline``).

``base`` holds what they share (read-only and guarded-lookup mixins, badges and
other column helpers, operations on one object or the selected rows, confirmed on a
page first, the context of a page an admin draws itself),
``bson_values`` how stored BSON is shown, and ``stores`` which configured store a page
shows. Django's admin autodiscovery imports this package, which imports each page
module; each registers its ``ModelAdmin`` with ``@admin.register``.
"""

from . import (  # noqa: F401
    approvals,
    checkpoints,
    console,
    dead_letters,
    messages,
    runs,
    workflows_page,
)
