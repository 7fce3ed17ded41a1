"""The operations around runs: the recovery sweep (``recovery``) and its thread
(``sweeper``), upgrades between versions (``upgrades``) and the versions in use
(``versions``), forks (``forking``), the journal (``journal``) and scheduled starts
(``schedule_ticks``)."""
