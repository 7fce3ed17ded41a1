"""What a workflow is: its steps and their outcomes (``steps``, ``results``), the
checks a definition passes (``checks``), the registry of defined workflows and versions
(``registry``), patches (``patches``), the snapshot metadata keys (``metadata``) and the
value of a decision (``decisions``). It imports only ``runs`` and ``storage``."""
