"""The actions of ``manage.py flowwarden_workflows``, one module per family of
subcommands: ``listing`` (list, show), ``control`` (resume, cancel, fork, recover),
``messages`` (send, events), ``versions`` (versions, upgrade), ``queues`` (queues)
and ``maintenance`` (prune, reencrypt); ``lookup``, ``inputs`` and ``output`` hold
what they share. The command module builds the parser
and dispatches to them."""
