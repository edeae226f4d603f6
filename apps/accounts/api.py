from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import ApiToken, Capability, Role, User
from apps.accounts.permissions import request_capabilities, request_user
from apps.accounts.services import api_token_create
from apps.common.routers import AppRouter


class UserSerializer(serializers.ModelSerializer):
    password = serializers.CharField(write_only=True, required=False, min_length=8)

    class Meta:
        model = User
        fields = ["id", "username", "email", "role", "is_active", "password"]

    def create(self, validated: dict[str, Any]) -> User:
        password = validated.pop("password", None)
        user = User(**validated)
        user.set_password(password) if password else user.set_unusable_password()
        user.save()
        return user

    def update(self, instance: User, validated: dict[str, Any]) -> User:
        password = validated.pop("password", None)
        for key, value in validated.items():
            setattr(instance, key, value)
        if password:
            instance.set_password(password)
        instance.save()
        return instance


class UserViewSet(viewsets.ModelViewSet):
    """Only admins manage users and roles."""

    queryset = User.objects.order_by("username")
    serializer_class = UserSerializer
    read_capability = Capability.ADMIN
    write_capability = Capability.ADMIN
    http_method_names = ["get", "post", "patch", "head", "options"]


class ApiTokenSerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(child=serializers.CharField(), allow_empty=False)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Your own API tokens. The secret is in the create response only; DELETE revokes."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()
    capability_map = {"list": Capability.READ, "create": Capability.READ, "destroy": Capability.READ}

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user=request_user(self.request)).order_by("-created_at")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, secret = api_token_create(
            user=request_user(request), granted=request_capabilities(request), **serializer.validated_data
        )
        return Response({**ApiTokenSerializer(token).data, "token": secret}, status=201)

    def perform_destroy(self, instance: ApiToken) -> None:
        instance.revoked_at = timezone.now()
        instance.save(update_fields=["revoked_at"])


@extend_schema(responses={200: OpenApiTypes.OBJECT})
@api_view(["GET"])
def me(request: Request) -> Response:
    user = request_user(request)
    return Response(
        {
            "id": user.pk,
            "username": user.username,
            "role": user.role,
            "capabilities": sorted(request_capabilities(request)),
            "roles": Role.values,
        }
    )


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("users", UserViewSet, basename="user")
router.register("tokens", ApiTokenViewSet, basename="token")
urlpatterns = [path("me/", me, name="me")]
