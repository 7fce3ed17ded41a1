"""What every mixin of the snapshot contract is."""


class SnapshotContractPart:
    """One concern of the ``SnapshotStore`` contract.

    Mixed into :class:`~flowwarden_django.testkit.SnapshotStoreContract`, which gives
    the ``store``, ``cid`` and ``events`` fixtures, its hooks and the ``chain`` and
    ``ids`` helpers.
    """
