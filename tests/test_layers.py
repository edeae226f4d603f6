"""What the layers of `workers/` promise beyond import-linter's contracts (pyproject.toml, docs/architecture.md):
the control plane's processes never load the training stack, and an import of `workers.*` hidden inside a function
is rare and says why."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINING_STACK = ("torch", "ray", "transformers", "vllm", "peft")
MAX_LOCAL_IMPORTS = 20


def test_the_web_process_and_the_celery_app_import_no_training_stack() -> None:
    script = (
        "import os, sys\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'controlplane.settings')\n"
        "import django\n"
        "django.setup()\n"
        "import controlplane.asgi, controlplane.celery, controlplane.urls\n"
        f"print(sorted(m for m in {TRAINING_STACK!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _local_workers_imports() -> list[tuple[str, int, str]]:
    found: dict[tuple[str, int], str] = {}
    for path in sorted((REPO_ROOT / "workers").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for sub in ast.walk(node):
                names = []
                if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("workers"):
                    names = [sub.module or ""]
                elif isinstance(sub, ast.Import):
                    names = [alias.name for alias in sub.names if alias.name.startswith("workers")]
                if names:
                    where = (str(path.relative_to(REPO_ROOT)), sub.lineno)
                    found[where] = lines[sub.end_lineno - 1 if sub.end_lineno else sub.lineno - 1]
    return [(path, line, text) for (path, line), text in sorted(found.items())]


def test_function_local_imports_of_workers_are_few_and_each_says_why() -> None:
    local = _local_workers_imports()
    assert len(local) < MAX_LOCAL_IMPORTS, local
    unexplained = [f"{path}:{line}" for path, line, text in local if "# local:" not in text]
    assert not unexplained, f"a function-local import needs a '# local: <reason>' comment: {unexplained}"
