"""What operators see and do: each stream's status (``status``, the rows each process
publishes), the replay of dead letters (``replay``) and checkpoint display (``display``)."""
