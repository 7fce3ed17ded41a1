"""``manage.py flowwarden_temporal_worker``: run flowwarden workflows on Temporal."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from importlib.util import find_spec
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ...common.durations import parse_duration
from ...conf import fw_settings
from ..base import add_options, positive_int, positive_seconds

#: The command's options: each flag with its ``add_argument`` keywords.
OPTIONS: dict[str, dict[str, Any]] = {
    "--concurrency": {
        "type": positive_int,
        "default": 10,
        "help": "Steps run at once, each on its own thread (default 10).",
    },
    "--task-queue": {
        "help": 'The task queue to poll (default: FLOWWARDEN["TEMPORAL"]["TASK_QUEUE"]).',
    },
    "--recover-every": {
        "type": positive_seconds,
        "help": "Seconds between recovery sweeps, which wake running runs nothing "
        'advances (default: FLOWWARDEN["WORKFLOW_SWEEP_INTERVAL"], 2s).',
    },
    "--no-recovery": {"action": "store_true", "help": "Run no recovery sweep in this worker."},
}


class Command(BaseCommand):
    help = (
        "Run the Temporal worker of flowwarden workflows: the run workflow and one activity "
        "per step, against this project's database. Stop it with SIGTERM or Ctrl-C: steps "
        "in flight finish first."
    )

    def add_arguments(self, parser: Any) -> None:
        add_options(parser, OPTIONS)

    def run_from_argv(self, argv: list[str]) -> None:
        """As a process (``manage.py flowwarden_temporal_worker``, never
        ``call_command``): once the worker stopped cleanly, end the process without
        the interpreter's teardown, during which the Temporal SDK's Rust threads can
        abort it ("PyGILState_Release ... must be current", temporalio/sdk-python#300)
        and turn a clean stop into exit status -6."""
        super().run_from_argv(argv)
        from django.db import connections

        connections.close_all()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def handle(self, *args: Any, **options: Any) -> None:
        if find_spec("temporalio") is None:
            raise CommandError(
                'The Temporal SDK is not installed: pip install "flowwarden-django[temporal]".'
            )
        from ...integrations.temporal.config import TemporalConfig
        from ...integrations.temporal.worker import serve

        try:
            config = TemporalConfig.from_settings()
        except ImproperlyConfigured as exc:
            raise CommandError(f"{exc}. Fix the setting, then start the worker again.") from exc
        if options["task_queue"]:
            config = dataclasses.replace(config, task_queue=options["task_queue"])
        recover_every = None
        if not options["no_recovery"]:
            recover_every = options["recover_every"] or parse_duration(
                fw_settings.WORKFLOW_SWEEP_INTERVAL
            )
        if options["verbosity"] >= 1:
            logging.getLogger("flowwarden_django.temporal").setLevel(logging.INFO)
            if not logging.getLogger().handlers:
                logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
        asyncio.run(serve(config, concurrency=options["concurrency"], recover_every=recover_every))
