from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied
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
    """Only admins manage users and roles. An admin cannot deactivate or demote themselves (403): another admin
    does that, so the last admin cannot lock everyone out."""

    queryset = User.objects.order_by("username")
    serializer_class = UserSerializer
    read_capability = Capability.ADMIN
    write_capability = Capability.ADMIN
    http_method_names = ["get", "post", "patch", "head", "options"]

    def perform_update(self, serializer: Any) -> None:
        data = serializer.validated_data
        if serializer.instance == self.request.user and (
            data.get("is_active") is False or data.get("role", Role.ADMIN) != Role.ADMIN
        ):
            raise PermissionDenied("you cannot deactivate yourself or change your own role; ask another admin")
        serializer.save()


class ApiTokenSerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=Capability.choices),
        allow_empty=False,
        min_length=1,
        help_text="Capabilities the token holds: your role's, or fewer (more is a 403)",
    )

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret (crk_...): shown here only, never again")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Your own API tokens. The secret is in the create response only; DELETE revokes."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()
    capability_map = {"list": Capability.READ, "create": Capability.READ, "destroy": Capability.READ}

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user=request_user(self.request)).order_by("-created_at")

    @extend_schema(responses={201: ApiTokenCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        granted = request_capabilities(request)
        beyond = sorted(set(serializer.validated_data["scopes"]) - granted)
        if beyond:
            raise PermissionDenied(f"your role or token ({sorted(granted)}) does not grant {beyond}")
        token, secret = api_token_create(user=request_user(request), granted=granted, **serializer.validated_data)
        return Response({**ApiTokenSerializer(token).data, "token": secret}, status=201)

    def perform_destroy(self, instance: ApiToken) -> None:
        instance.revoked_at = timezone.now()
        instance.save(update_fields=["revoked_at"])


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)
    capabilities = serializers.ListField(
        child=serializers.ChoiceField(choices=Capability.choices), help_text="What this request may do"
    )
    roles = serializers.ListField(child=serializers.ChoiceField(choices=Role.choices), help_text="Every role")


@extend_schema(responses={200: MeSerializer})
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
