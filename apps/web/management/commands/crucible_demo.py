from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.web.demo import load_demo, start_coding_demo
from apps.web.example import start_example_run


class Command(BaseCommand):
    help = (
        "Load demo users (one per role), datasets, reward configs, benchmarks and gates. Idempotent. --coding also "
        "starts the coding agent's demo: a generation run of repository tasks and its held-out benchmark; --example "
        "the example training run (both need the Celery worker and Ray, as `make run` has)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--coding", action="store_true", help="start (or finish) the coding agent's demo suite")
        parser.add_argument(
            "--example",
            action="store_true",
            help="start the example training run once (GRPO of SmolLM2-135M on demo-arithmetic, auto-evaluated, "
            "with a gate): what a fresh installation's first screen shows",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        creds = load_demo()
        if options["example"]:
            self.stdout.write(start_example_run())
        if options["coding"]:
            self.stdout.write(start_coding_demo())
        self.stdout.write(self.style.SUCCESS("Demo data ready. Log in at http://127.0.0.1:8000/ as:"))
        for username, password in creds.items():
            self.stdout.write(f"  {username:<9} password: {password}")
