"""The operations around runs: the recovery sweep (``recovery``) and its thread
(``sweeper``), upgrades between versions (``upgrades``) and the versions in use
(``versions``), forks (``forking``), the journal (``journal``), scheduled starts
(``schedule_ticks``) and a run's timeline (``timeline``)."""
