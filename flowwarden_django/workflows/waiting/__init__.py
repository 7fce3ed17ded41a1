"""How a run waits and is woken: approvals (``approvals``), children (``children``),
messages and events (``messages``) and cancellation (``cancellation``). Sleep is a step
outcome (``definition.steps``) that the recovery sweep wakes (``operations.recovery``)."""
