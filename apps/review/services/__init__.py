"""Writes of the review app, one module per seam: `queues` (labels, queues and their locks), `actions` (what a
confirmed hack leads to: a reward draft, a regression case in a benchmark, a task excluded from training),
`exclusions` (the guard training and SFT pass), `flags` (run-level flags the control plane finds). Flag events from
workers are stored by `apps.review.ingest`."""

from apps.review.services.actions import (
    reward_draft_accept,
    reward_draft_create,
    reward_draft_discard,
    task_exclude,
    task_promote,
)
from apps.review.services.exclusions import excluded_tasks_in, task_exclusion_guard
from apps.review.services.flags import flags_record
from apps.review.services.queues import (
    MIN_LOCK_TIMEOUT_S,
    item_label,
    queue_create,
    queue_next,
    queue_sync,
    queue_sync_all,
    review_submit,
)

__all__ = [
    "MIN_LOCK_TIMEOUT_S",
    "excluded_tasks_in",
    "flags_record",
    "item_label",
    "queue_create",
    "queue_next",
    "queue_sync",
    "queue_sync_all",
    "review_submit",
    "reward_draft_accept",
    "reward_draft_create",
    "reward_draft_discard",
    "task_exclude",
    "task_exclusion_guard",
    "task_promote",
]
