"""The consumer core: the decisions of one stream's consumer, written once, with no I/O.

Each decision is a generator (``resume.open_stream``, ``heartbeat.on_idle``, ...) that
*yields* the I/O it needs as effects (``effects``: open a cursor, read the checkpoint,
write the seen anchor...) and receives each effect's result back, or its exception
thrown in. It reads the clock and logs, but touches no store, source, thread or event
loop. The two runtimes are drivers (``driving``): the threaded ``StreamConsumer``
performs an effect with a plain call, the asyncio ``AsyncStreamConsumer`` awaits it,
so the control flow (the resume cascade, the history-lost strategies, the heartbeat's
decision) exists once and is tested once, by feeding results to the generators
(``tests/streams/test_core.py``), as protocol libraries such as h11 and wsproto do.
"""
