from __future__ import annotations

from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability
from apps.review.models import Flag, Review
from apps.review.services import review_submit


class ReviewSerializer(serializers.ModelSerializer):
    reviewer = serializers.StringRelatedField()

    class Meta:
        model = Review
        fields = ["id", "flag", "reviewer", "label", "note", "created_at"]
        read_only_fields = ["flag", "reviewer", "created_at"]


class FlagSerializer(serializers.ModelSerializer):
    reviews = ReviewSerializer(many=True, read_only=True)

    class Meta:
        model = Flag
        fields = [
            "id",
            "run",
            "trajectory_ref",
            "detector",
            "detector_version",
            "severity",
            "evidence",
            "step",
            "created_at",
            "reviews",
        ]


class FlagViewSet(viewsets.ReadOnlyModelViewSet):
    """Flags are read by everyone; only reviewers (and admins) judge them."""

    serializer_class = FlagSerializer
    queryset = Flag.objects.prefetch_related("reviews__reviewer").order_by("-created_at")
    capability_map = {"review": Capability.REVIEW}

    @action(detail=True, methods=["post"])
    def review(self, request: Request, pk: str | None = None) -> Response:
        body = ReviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        review = review_submit(
            flag=self.get_object(),
            reviewer=request.user,
            label=body.validated_data["label"],
            note=body.validated_data.get("note", ""),
        )
        return Response(ReviewSerializer(review).data, status=status.HTTP_201_CREATED)
