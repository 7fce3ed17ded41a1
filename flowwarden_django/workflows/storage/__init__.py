"""Where a run's history is kept: the snapshot (``snapshot``), the ``SnapshotStore``
SPI and its aliases (``store``), its signals (``signals``), what a state becomes at
rest (``serializers``, ``encryption``) and which snapshots a prune keeps
(``retention``). The stores themselves are in ``workflows.backends``."""
