from django.core.management.base import BaseCommand

from apps.web.demo import load_demo


class Command(BaseCommand):
    help = "Load demo users (one per role), a trajectories dataset and the Context-1 reward config. Idempotent."

    def handle(self, *args: object, **options: object) -> None:
        creds = load_demo()
        self.stdout.write(self.style.SUCCESS("Demo data ready. Log in at http://127.0.0.1:8000/ as:"))
        for username, password in creds.items():
            self.stdout.write(f"  {username:<9} password: {password}")
