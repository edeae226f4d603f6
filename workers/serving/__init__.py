"""Serving (`kind=serve`): an OpenAI-compatible Chat Completions endpoint on Ray Serve, hot-swapped by the delta
weight sync and recording every completion as a session turn.

- `openai_api`: the request and response shapes, OpenAI-style errors, and how a request becomes the prompt the
  environments use (tools in the system prompt, `<tool_call>` blocks) and a reply becomes `tool_calls`.
- `control`: the control plane's target and key verification, and the session-hash arm choice.
- `app`: the Serve deployments (router ingress, arm replicas).
- `weights`: policy states for a checkpoint, and the `WeightStore` that carries sync blobs to replicas.
- `recorder`: the `Recorder` actor (the run's one Reporter) and the replicas' `Shipper`.
- `controller`: the job's driver loop (`workers.jobs.serve`).

Importing this package is cheap; `app` and `controller` import ray and FastAPI.
"""
