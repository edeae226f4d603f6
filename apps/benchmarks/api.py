from __future__ import annotations

from rest_framework import serializers, viewsets

from apps.benchmarks.models import Benchmark, BenchmarkVersion


class BenchmarkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Benchmark
        fields = ["id", "name", "description", "environment", "metric", "created_at"]


class BenchmarkVersionSerializer(serializers.ModelSerializer):
    task_count = serializers.IntegerField(source="tasks.count", read_only=True)

    class Meta:
        model = BenchmarkVersion
        fields = ["id", "benchmark", "number", "content_hash", "notes", "task_count", "created_at"]


class BenchmarkViewSet(viewsets.ReadOnlyModelViewSet):
    """Benchmarks are read here; building and versioning them arrives with the gates issue."""

    serializer_class = BenchmarkSerializer
    queryset = Benchmark.objects.order_by("name")


class BenchmarkVersionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = BenchmarkVersionSerializer
    queryset = BenchmarkVersion.objects.select_related("benchmark").order_by("-created_at")
