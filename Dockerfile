# syntax=docker/dockerfile:1
# Crucible image. The default target (`runtime`, the last stage) is the CPU image that docker-compose.yml runs as
# web (uvicorn, worker processes), Celery worker and beat, and the Ray head. Target `gpu` is the image for the
# `ray-gpu-worker` service (compose profile "gpu"): the same code plus the `[gpu]` extra (vLLM, CUDA torch).
#
#   docker build -t crucible:local .                       # CPU image
#   docker build --target gpu -t crucible-gpu:local .      # GPU image

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base

# The code runs from /app (BASE_DIR: templates/, static/, manage.py), never from a copy in site-packages.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=controlplane.settings \
    CRUCIBLE_MEDIA_ROOT=/data/media \
    HOME=/home/crucible

# An unprivileged user owns the code and the media volume's mount point (a new named volume copies this ownership).
RUN useradd --create-home --uid 1000 --shell /bin/bash crucible \
    && mkdir -p /app /data/media \
    && chown crucible:crucible /app /data/media

WORKDIR /app

# ---------------------------------------------------------------------------------------------------------------
FROM base AS gpu

# vLLM pins its own CUDA torch, transformers and numpy, which clash with the CPU stack's pins in pyproject.toml
# (vllm 0.33.0: torch==2.14.0, transformers>=5.16.1,<5.21, numpy<2.4 through mistral-common). uv's overrides let
# `.[gpu]` install with vLLM's versions instead of failing to resolve (pip backtracks down to vllm 0.1.x).
# The torch 2.14 wheel from PyPI is a CUDA 13 build: the host needs a matching NVIDIA driver and the
# NVIDIA Container Toolkit.
ARG VLLM_VERSION=0.33.0
ARG GPU_TORCH_VERSION=2.14.0
ARG UV_VERSION=0.13.9

# Triton (under torch.compile and vLLM's kernels) compiles small C launchers at run time: it needs a C compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && pip install "uv==${UV_VERSION}"

COPY pyproject.toml README.md ./
RUN printf 'torch==%s\ntransformers>=5.16.1,<5.21\nnumpy>=1.25,<2.4\n' "${GPU_TORCH_VERSION}" > /tmp/gpu-overrides.txt \
    && uv pip install --system --no-cache --override /tmp/gpu-overrides.txt ".[gpu]" "vllm==${VLLM_VERSION}" \
    && rm -rf build *.egg-info

COPY --chown=crucible:crucible . .
RUN uv pip install --system --no-cache --no-deps -e . \
    && python -c "from importlib.metadata import version as v; print({p: v(p) for p in ('ray', 'vllm', 'torch', 'transformers')})"

USER crucible
CMD ["ray", "start", "--address=ray-head:6379", "--block", "--disable-usage-stats"]

# ---------------------------------------------------------------------------------------------------------------
FROM base AS runtime

# torch first, in its own step, from the CPU index: anything else would pull a multi-GB CUDA build.
# torch 2.13.0+cpu satisfies pyproject.toml's torch==2.13.0 pin, so the next step leaves it alone.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# The dependency layer depends only on pyproject.toml (and README.md, which it names), so code edits rebuild fast.
COPY pyproject.toml README.md ./
# (Before the code is copied the package finds no modules: this installs the pinned dependencies only.)
RUN pip install . && rm -rf build *.egg-info

COPY --chown=crucible:crucible . .
# Re-install the project itself (no dependencies) as an editable install pointing at /app.
RUN pip install --no-deps --force-reinstall -e . \
    && python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__; assert not torch.cuda.is_available()"

USER crucible
# collectstatic only reads settings; the secret here is a build-time placeholder, never used at run time.
RUN DJANGO_SECRET_KEY=collectstatic-only DJANGO_DEBUG=0 python manage.py collectstatic --noinput

EXPOSE 8000
CMD ["sh", "-c", "exec uvicorn controlplane.asgi:application --host 0.0.0.0 --port 8000 --workers ${CRUCIBLE_WEB_WORKERS:-2}"]
