"""The initial sync: copying a collection's existing documents before streaming it.

``copier`` (``InitialSync``) copies in batches whose progress is saved with the
checkpoint, so a killed copy resumes after its last committed batch; ``progress``
names the states of that record, ``filter`` narrows what is copied, and ``resync``
asks a running stream to copy again.
"""

from .copier import CopyInterrupted, InitialSync, InitialSyncConflictError, decode_id, encode_id

__all__ = ["CopyInterrupted", "InitialSync", "InitialSyncConflictError", "decode_id", "encode_id"]
