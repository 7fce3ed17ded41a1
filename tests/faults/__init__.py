"""Network faults: silent partitions between a worker in a namespace of the test's own
and the servers on the host (issue 51). ``make test-faults`` runs them alone."""
