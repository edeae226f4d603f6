"""Models by Hugging Face Hub id (`org/name`, optionally `@revision`): told apart from built-in names and paths,
checked cheaply where a run is created, and resolved on the worker that loads them.

Resolution (`resolve_hub_model`) runs on the Ray worker, never on the web host: it asks the Hub which commit the
revision points at, downloads the files a causal LM needs into a shared cache (`hub_cache_dir`: `$HF_HUB_CACHE`,
else `$CRUCIBLE_MODEL_CACHE/hub`, else `$HF_HOME/hub`) under a file lock, so two
actors on one node fetch it once, and returns the snapshot directory with that commit hash (what was trained is
then reproducible). A token comes from `HF_TOKEN` (gated and private repositories), the Hub from `HF_ENDPOINT`,
both read at call time. With `HF_HUB_OFFLINE=1`, or when the Hub cannot be reached, only the cache is used, and a
model missing from it is an error naming the cache and `HF_HUB_OFFLINE`.

Which string is which (`classify_model_name`): a built-in name; a path when it starts with `/`, `~`, `./` or
`../`, or is an existing directory here; a Hub id when it has the form `org/name[@revision]`. Anything else is
refused. A Hub id always names its organisation (`openai-community/gpt2`, not `gpt2`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ModelKind = Literal["builtin", "path", "hub"]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{{0,199}}))?$")
"""`org/name` with an optional `@revision` (a branch, a tag, `refs/pr/N` or a commit hash)."""

_PATH_PREFIXES = ("/", "~", "./", "../")
CHECK_TIMEOUT_SECONDS = 5.0
"""How long a launch waits for the Hub to answer before it leaves the check to the worker's preflight
(`CRUCIBLE_HUB_CHECK_SECONDS` overrides it)."""

# What a causal LM needs from a repository: its config, weights in safetensors (pickled .bin only where there are
# none), the tokenizer and generation config, the model card. Other formats (ONNX, GGUF, TF, Flax) are not fetched.
_WANTED = re.compile(
    r"^(?:[^/]+\.json|[^/]+\.safetensors|[^/]+\.jinja|[^/]+\.txt|[^/]+\.model|[^/]+\.tiktoken|README\.md)$"
)
_PICKLED_WEIGHTS = re.compile(r"^pytorch_model[^/]*\.bin$")


class ModelUnavailable(ValueError):
    """A model that cannot be had: not found, gated without a token, not in the cache offline, not a causal LM."""


@dataclass(frozen=True)
class HubRef:
    """A Hub repository and the revision asked for (None: its default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class ResolvedModel:
    """A Hub model on this node: its snapshot directory, the commit it is, whether the cache already held it, and
    its card (what the run page shows)."""

    path: Path
    ref: HubRef
    commit: str
    from_cache: bool
    card: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What a run stores about the model (its summary's `models` entry)."""
        return {
            "source": "hub",
            "id": self.ref.repo_id,
            "revision": self.ref.revision or "main",
            "commit": self.commit,
            "from_cache": self.from_cache,
            "card": self.card,
        }


Progress = Callable[[int, int, str], None]
"""Told (bytes done, bytes in all, file just fetched) after each file of a download."""


def classify_model_name(name: str, builtins: set[str] | frozenset[str] = frozenset()) -> ModelKind | None:
    """Whether `name` is a built-in name, a path or a Hub id (see the module docstring); None when it is none."""
    if name in builtins:
        return "builtin"
    if not name.strip():
        return None
    if name.startswith(_PATH_PREFIXES) or Path(name).expanduser().is_dir():
        return "path"
    if HUB_ID.match(name):
        return "hub"
    return None


def parse_hub_id(name: str) -> HubRef:
    found = HUB_ID.match(name)
    if found is None:
        raise ModelUnavailable(f"{name!r} is not a Hub id: use org/name or org/name@revision")
    return HubRef(found["repo"], found["revision"])


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> Path:
    """Where Hub downloads go: `$HF_HUB_CACHE` when set (Hugging Face's own switch for it), else
    `$CRUCIBLE_MODEL_CACHE/hub` beside the built-in models, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`."""
    if os.environ.get("HF_HUB_CACHE", "").strip():
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    crucible = os.environ.get("CRUCIBLE_MODEL_CACHE", "")
    if crucible.strip():
        return Path(crucible).expanduser() / "hub"
    home = Path(os.environ["HF_HOME"]).expanduser() if os.environ.get("HF_HOME") else Path.home() / ".cache/huggingface"
    return home / "hub"


def hub_config(ref: HubRef, *, timeout: float | None = None) -> dict[str, Any] | None:
    """The repository's config.json, fetched where a run is created to catch a typo and estimate memory.

    Raises `ModelUnavailable` when the Hub says there is no such repository, revision or config; returns None when
    it cannot tell (offline, unreachable, slow, or gated without a token here: the workers may hold one), which
    leaves the check to the worker's preflight."""
    if hub_offline():
        return None
    import httpx

    if timeout is None:
        raw = os.environ.get("CRUCIBLE_HUB_CHECK_SECONDS", "").strip()
        timeout = float(raw) if raw else CHECK_TIMEOUT_SECONDS
    revision = ref.revision or "main"
    url = f"{hub_endpoint()}/{ref.repo_id}/resolve/{revision}/config.json"
    token = hub_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError:
        return None
    code = response.headers.get("X-Error-Code", "")
    if response.status_code == 200:
        try:
            config = response.json()
        except ValueError:
            raise ModelUnavailable(f"{ref}: its config.json is not JSON") from None
        if not isinstance(config, dict):
            raise ModelUnavailable(f"{ref}: its config.json is not a JSON object")
        if problem := causal_lm_problem(config):
            raise ModelUnavailable(f"{ref}: {problem}")
        return config
    if code == "GatedRepo":
        return None
    if code == "RepoNotFound" or (response.status_code in (401, 404) and not code):
        raise ModelUnavailable(
            f"no model {ref.repo_id!r} on {hub_endpoint()}: check the spelling (org/name); a private repository "
            "needs HF_TOKEN"
        )
    if code == "RevisionNotFound":
        raise ModelUnavailable(f"{ref.repo_id!r} has no revision {revision!r} on {hub_endpoint()}")
    if code == "EntryNotFound" or response.status_code == 404:
        raise ModelUnavailable(f"{ref}: the repository has no config.json, so it is not a transformers model")
    return None  # a 5xx or anything else: the Hub cannot tell now


def causal_lm_problem(config: dict[str, Any]) -> str:
    """Why a model config is not a causal language model transformers can load ('' when it is): its listed
    architectures decide, else (none listed) whether transformers maps its model_type to a causal LM."""
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in architectures):
        return ""
    model_type = str(config.get("model_type", ""))
    if not architectures:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return ""
    named = ", ".join(architectures) or f"model_type {model_type!r}"
    return f"not a causal language model ({named}): Crucible trains and samples AutoModelForCausalLM models"


_RESOLVED: dict[tuple[str, str], ResolvedModel] = {}
"""Hub ids this process has resolved, by (id, cache): a job asks for its base model several times."""


def resolve_hub_model(name: str, *, cache_dir: Path | None = None, progress: Progress | None = None) -> ResolvedModel:
    """Download (or find in the cache) the Hub model `name` and return its snapshot directory and commit.

    Under a per-repository file lock, so concurrent callers on one node download once. Raises `ModelUnavailable`
    with the reason and the fix."""
    ref = parse_hub_id(name)
    cache = cache_dir if cache_dir is not None else hub_cache_dir()
    key = (name, str(cache))
    if key in _RESOLVED:
        return _RESOLVED[key]
    cache.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / ".crucible-locks" / (ref.repo_id.replace("/", "--") + ".lock")):
        resolved = _from_cache(ref, cache) if hub_offline() else _download(ref, cache, progress)
    config = json.loads((resolved.path / "config.json").read_text())
    if problem := causal_lm_problem(config):
        raise ModelUnavailable(f"{ref}: {problem}")
    _RESOLVED[key] = resolved
    return resolved


def _from_cache(ref: HubRef, cache: Path, reason: str = "HF_HUB_OFFLINE is set") -> ResolvedModel:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(ref.repo_id, revision=ref.revision, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        raise ModelUnavailable(
            f"{ref} is not in the model cache {cache} and {reason}: download it once with network access "
            "(unset HF_HUB_OFFLINE), or point CRUCIBLE_MODEL_CACHE at a cache that holds it"
        ) from None
    if not (path / "config.json").is_file():
        raise ModelUnavailable(f"{ref}: the cached snapshot {path} has no config.json")
    return ResolvedModel(path=path, ref=ref, commit=path.name, from_cache=True, card=model_card(path, {}))


def _download(ref: HubRef, cache: Path, progress: Progress | None) -> ResolvedModel:
    from httpx2 import TransportError  # huggingface_hub's HTTP client: a refused connection, a timeout
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint, token = hub_endpoint(), hub_token()
    try:
        return _fetch(ref, cache, progress, endpoint=endpoint, token=token)
    except GatedRepoError:  # a RepositoryNotFoundError too: test it first
        fix = "the token in HF_TOKEN has no access to it" if token else "set HF_TOKEN to a token with access"
        raise ModelUnavailable(f"{ref} is a gated repository on {endpoint}: {fix}") from None
    except RevisionNotFoundError:
        raise ModelUnavailable(f"{ref.repo_id!r} has no revision {ref.revision!r} on {endpoint}") from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(
            f"no model {ref.repo_id!r} on {endpoint}: check the spelling (org/name); a private repository "
            "needs HF_TOKEN"
        ) from None
    except (HfHubHTTPError, TransportError, OSError) as exc:  # the Hub is down or unreachable: try the cache
        return _from_cache(ref, cache, reason=f"the Hub at {endpoint} could not be reached ({type(exc).__name__})")


def _fetch(ref: HubRef, cache: Path, progress: Progress | None, *, endpoint: str, token: str | None) -> ResolvedModel:
    from huggingface_hub import HfApi, hf_hub_download

    auth: str | bool = token or False  # False: never a token saved on this machine by `hf auth login`
    info = HfApi(endpoint=endpoint, token=auth).model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
    commit = str(info.sha)
    siblings = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    files = {name: size for name, size in siblings.items() if _WANTED.match(name)}
    if not any(name.endswith(".safetensors") for name in files):
        files |= {name: size for name, size in siblings.items() if _PICKLED_WEIGHTS.match(name)}
    if "config.json" not in files:
        raise ModelUnavailable(f"{ref}: the repository has no config.json, so it is not a transformers model")
    snapshot = cache / f"models--{ref.repo_id.replace('/', '--')}" / "snapshots" / commit
    from_cache = all((snapshot / name).is_file() for name in files)
    total, done = sum(files.values()), 0
    started = time.monotonic()
    for name in sorted(files, key=lambda n: (n.endswith((".safetensors", ".bin")), n)):  # small files first
        hf_hub_download(ref.repo_id, name, revision=commit, cache_dir=cache, endpoint=endpoint, token=auth)
        done += files[name]
        if progress is not None:
            progress(done, total, name)
    if ref.revision != commit:  # what the revision points at, so an offline lookup of it finds this snapshot
        pointer = cache / f"models--{ref.repo_id.replace('/', '--')}" / "refs" / (ref.revision or "main")
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(commit)
    card = model_card(snapshot, _card_data(info), seconds=0.0 if from_cache else time.monotonic() - started)
    return ResolvedModel(path=snapshot, ref=ref, commit=commit, from_cache=from_cache, card=card)


def _card_data(info: Any) -> dict[str, Any]:
    data = getattr(info, "card_data", None) or getattr(info, "cardData", None)
    if data is None:
        return {}
    return dict(data.to_dict() if hasattr(data, "to_dict") else data)


def model_card(path: Path, card_data: dict[str, Any], *, seconds: float = 0.0) -> dict[str, Any]:
    """What the run page shows about a resolved model: parameters, context length, whether it has a chat template,
    its license and the size of its weights."""
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    weights = sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".safetensors", ".bin"))
    tokenizer_config = path / "tokenizer_config.json"
    chat = (path / "chat_template.jinja").is_file() or (
        tokenizer_config.is_file() and "chat_template" in json.loads(tokenizer_config.read_text())
    )
    license_ = card_data.get("license") or _license_from_readme(path / "README.md")
    card: dict[str, Any] = {
        "architecture": ", ".join(config.get("architectures") or []) or str(config.get("model_type", "")),
        "context_length": config.get("max_position_embeddings") or config.get("n_positions"),
        "chat_template": chat,
        "license": license_ or "",
        "weights_bytes": weights,
        "parameters": _parameters(path, config, weights),
    }
    if seconds:
        card["download_seconds"] = round(seconds, 2)
    return card


def _parameters(path: Path, config: dict[str, Any], weights: int) -> int | None:
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    width = 2 if dtype in ("bfloat16", "float16") else 4
    index = path / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int):
            return total // width
    return weights // width if weights else None


def _license_from_readme(readme: Path) -> str:
    if not readme.is_file():
        return ""
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return ""
    front = text[3:].split("\n---", 1)[0]
    found = re.search(r"^license:\s*(\S+)", front, re.MULTILINE)
    return found[1].strip("'\"") if found else ""


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock on `path` (made, with its folder, if missing): one process at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
