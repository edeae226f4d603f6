from __future__ import annotations

from django.db import IntegrityError, transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.review.models import Flag, Label, Review


def review_submit(*, flag: Flag, reviewer: User, label: str, note: str = "") -> Review:
    if label not in Label.values:
        raise ValidationError({"label": [f"unknown label {label!r}; choose one of {Label.values}"]})
    try:
        with transaction.atomic():
            return Review.objects.create(flag=flag, reviewer=reviewer, label=label, note=note)
    except IntegrityError:
        raise ValidationError({"flag": [f"you already reviewed flag {flag.pk}; each reviewer labels a flag once"]})
