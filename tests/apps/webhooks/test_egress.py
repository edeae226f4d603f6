"""The SSRF guard (apps/webhooks/egress.py): a delivery goes only to public addresses, or to the networks
WEBHOOK_ALLOWED_NETWORKS names; it connects to the address it checked; it follows no redirect; a refusal is stored
on the delivery and shown by the API and the admin's delivery list.

Name resolution is the operating system's: tests that need a name to resolve somewhere patch socket.getaddrinfo
for names under .test (RFC 6761: never real) and pass every other name to the real resolver."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.exceptions import ValidationError

from apps.webhooks import egress
from apps.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint, validate_webhook_url
from apps.webhooks.services import webhook_deliver, webhook_emit, webhook_endpoint_create, webhook_redeliver
from controlplane.env import SettingError, env_networks

pytestmark = pytest.mark.django_db

REAL_GETADDRINFO = socket.getaddrinfo
PUBLIC = "93.184.215.14"


@pytest.fixture
def no_allowed_networks(settings):  # type: ignore[no-untyped-def]
    """Production's default: no network beyond the public internet."""
    settings.WEBHOOK_ALLOWED_NETWORKS = []


class FakeDNS:
    """Names under .test resolve to `records[name]` (a list of addresses, or a function giving the next answer);
    `lookups` counts the lookups of each. Every other name goes to the real resolver."""

    def __init__(self) -> None:
        self.records: dict[str, list[str] | Callable[[], list[str]]] = {}
        self.lookups: dict[str, int] = {}

    def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if not name.endswith(".test"):
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        self.lookups[name] = self.lookups.get(name, 0) + 1
        record = self.records.get(name)
        if record is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = []
        for address in record() if callable(record) else record:
            if ":" in address:
                answers.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, int(port), 0, 0)))
            else:
                answers.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port))))
        return answers


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    return fake


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Replace the network with a transport that records each request and answers 200: what would have gone out."""
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, text="ok")

    monkeypatch.setattr("apps.webhooks.services._transport", lambda: httpx.MockTransport(handler))
    return requests


def endpoint_at(users: dict[str, Any], url: str, name: str = "hook") -> WebhookEndpoint:
    """An endpoint saved without the save-time check: one created before the guard, or under other settings."""
    return WebhookEndpoint.objects.create(name=name, url=url, events=["*"], created_by=users["admin"])


def deliver_one() -> WebhookDelivery:
    [delivery_id] = webhook_emit(event="deployment.created", payload={"deployment": 1})
    webhook_deliver(delivery_id=delivery_id)
    return WebhookDelivery.objects.get(pk=delivery_id)


def assert_refused(delivery: WebhookDelivery, *words: str) -> None:
    assert delivery.status == DeliveryStatus.FAILED and delivery.next_attempt_at is None  # not retried
    assert delivery.refused_reason.startswith("refused, not sent: ")
    assert "CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS" in delivery.refused_reason
    for word in words:
        assert word in delivery.refused_reason, (word, delivery.refused_reason)
    [attempt] = delivery.attempt_log.all()
    assert attempt.status_code is None and attempt.error == delivery.refused_reason
    assert attempt.response_excerpt == ""


# --- refused at delivery time ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("127.0.0.1", ["127.0.0.1", "loopback"]),
        ("169.254.169.254", ["169.254.169.254", "link-local", "metadata"]),
        ("10.0.0.1", ["10.0.0.1", "private"]),
        ("[::1]", ["::1", "loopback"]),
        ("[::ffff:127.0.0.1]", ["(IPv4 127.0.0.1)", "loopback"]),
        ("[::ffff:a9fe:a9fe]", ["IPv4 169.254.169.254", "link-local"]),
        ("[64:ff9b::a00:1]", ["IPv4 10.0.0.1", "private"]),
        ("0.0.0.0", ["0.0.0.0", "unspecified"]),
        ("100.64.0.1", ["100.64.0.1", "shared"]),
        ("2130706433", ["127.0.0.1", "loopback"]),  # 127.0.0.1 spelled as one number: the resolver reads it
        ("0x7f000001", ["127.0.0.1", "loopback"]),  # ... and in hexadecimal
        ("[fe80::1]", ["fe80::1", "link-local"]),
        ("[fd00::1]", ["fd00::1", "private"]),
    ],
)
def test_a_delivery_to_a_non_public_address_is_refused_with_the_reason_stored_and_nothing_sent(
    users, no_allowed_networks, sent, host, words
):
    endpoint_at(users, f"http://{host}:8080/hooks")
    assert_refused(deliver_one(), *words)
    assert sent == []


def test_a_real_loopback_receiver_gets_nothing_when_loopback_is_not_allowed(users, receiver, no_allowed_networks):
    endpoint_at(users, receiver.url)
    assert_refused(deliver_one(), "127.0.0.1", "loopback")
    assert receiver.requests == []


def test_a_name_that_resolves_to_loopback_is_refused(users, receiver, no_allowed_networks):
    endpoint_at(users, f"http://localhost:{receiver.port}/hooks")  # the machine's own resolver
    assert_refused(deliver_one(), "'localhost' resolves to", "loopback")
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("records", "words"),
    [
        (["169.254.169.254"], ["'hooks.example.test' resolves to 169.254.169.254", "link-local"]),
        (["10.0.0.1"], ["'hooks.example.test' resolves to 10.0.0.1", "private"]),
        (["::1"], ["'hooks.example.test' resolves to ::1", "loopback"]),
        (["::ffff:10.1.2.3"], ["IPv4 10.1.2.3", "private"]),
        # One bad record among good ones refuses the delivery: it cannot be told which one a connection would use.
        ([PUBLIC, "10.0.0.1"], ["resolves to 10.0.0.1", "private"]),
        (["2606:2800:21f:cb07:6820:80da:af6b:8b2c", "127.0.0.1"], ["resolves to 127.0.0.1", "loopback"]),
    ],
)
def test_a_name_resolving_to_any_non_public_address_is_refused(users, dns, sent, no_allowed_networks, records, words):
    dns.records["hooks.example.test"] = records
    endpoint_at(users, "https://hooks.example.test/crucible")
    assert_refused(deliver_one(), *words)
    assert sent == []


def test_no_network_is_allowed_by_default_debug_or_not():
    """Loopback and private receivers are an explicit setting (CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS), off by default;
    DJANGO_DEBUG does not turn it on (it used to). Read in a fresh process: the settings read the environment once."""
    code = "from django.conf import settings; print(settings.WEBHOOK_ALLOWED_NETWORKS)"
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRUCIBLE_WEBHOOK_"))}
    for debug in ("", "1"):
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {code}"],
            env={**inherited, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "DJANGO_DEBUG": debug},
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == "[]", (debug, done.stdout, done.stderr)


def test_allowing_every_private_network_still_never_allows_link_local(users, dns, sent, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    dns.records["metadata.example.test"] = ["169.254.169.254"]
    endpoint_at(users, "http://metadata.example.test/latest/meta-data/")
    assert_refused(deliver_one(), "169.254.169.254", "link-local")
    assert sent == []


# --- allowed -----------------------------------------------------------------------------------------------------
def test_the_allowed_networks_setting_lets_a_loopback_receiver_through(users, receiver, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    webhook_endpoint_create(created_by=users["admin"], name="by-address", url=receiver.url, events=["*"])
    webhook_endpoint_create(
        created_by=users["admin"], name="by-name", url=f"http://localhost:{receiver.port}/hooks", events=["*"]
    )
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]  # localhost may resolve to ::1 too
    ids = webhook_emit(event="deployment.created", payload={"deployment": 1})
    for delivery_id in ids:
        webhook_deliver(delivery_id=delivery_id)
    deliveries = WebhookDelivery.objects.filter(pk__in=ids)
    assert {(d.status, d.refused_reason) for d in deliveries} == {(DeliveryStatus.SUCCEEDED, "")}
    assert len(receiver.requests) == 2


def test_a_public_address_needs_no_setting(users, dns, sent, no_allowed_networks):
    dns.records["hooks.example.test"] = [PUBLIC]
    endpoint_at(users, "https://hooks.example.test/crucible")
    assert deliver_one().status == DeliveryStatus.SUCCEEDED
    assert len(sent) == 1


# --- connecting to the checked address ---------------------------------------------------------------------------
def test_the_request_goes_to_the_checked_address_with_the_names_host_header_and_tls_server_name(
    users, dns, sent, no_allowed_networks
):
    dns.records["hooks.example.test"] = [PUBLIC]
    endpoint_at(users, "https://hooks.example.test:8443/crucible?team=ml")
    deliver_one()
    [request] = sent
    assert (request.url.host, request.url.port, request.url.path) == (PUBLIC, 8443, "/crucible")
    assert request.url.query == b"team=ml"
    assert request.headers["Host"] == "hooks.example.test:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.test"  # TLS checks the name's certificate
    assert dns.lookups == {"hooks.example.test": 1}


def test_a_name_is_resolved_once_so_a_rebinding_answer_never_reaches_the_connection(users, dns, receiver, settings):
    """A DNS rebinding attack: the name answers an allowed address to the check and a forbidden one after. The
    connection goes to the address checked (here the real loopback receiver), so the second answer is never used."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    answers = iter([["127.0.0.1"], ["169.254.169.254"]])
    dns.records["rebind.example.test"] = lambda: next(answers)
    endpoint_at(users, f"http://rebind.example.test:{receiver.port}/hooks")
    assert deliver_one().status == DeliveryStatus.SUCCEEDED
    [request] = receiver.requests
    assert request.header("Host") == f"rebind.example.test:{receiver.port}"
    assert dns.lookups == {"rebind.example.test": 1}


def test_an_unresolvable_name_is_an_error_attempt_and_retried(users, dns, no_allowed_networks):
    endpoint_at(users, "https://nowhere.example.test/hooks")
    delivery = deliver_one()
    assert (delivery.status, delivery.refused_reason) == (DeliveryStatus.PENDING, "")
    assert delivery.next_attempt_at is not None
    assert "could not resolve 'nowhere.example.test'" in delivery.attempt_log.get().error


def test_the_next_address_is_tried_when_one_refuses_the_connection(users, dns, receiver, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    dns.records["two.example.test"] = ["127.0.0.2", "127.0.0.1"]  # nothing listens on 127.0.0.2 at the receiver's port
    endpoint_at(users, f"http://two.example.test:{receiver.port}/hooks")
    assert deliver_one().status == DeliveryStatus.SUCCEEDED
    assert len(receiver.requests) == 1


# --- redirects ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_recorded_as_the_result_and_not_followed(endpoint, receiver, status):
    receiver.answer(status)
    receiver.reply_headers = {"Location": "http://169.254.169.254/latest/meta-data/"}
    delivery = deliver_one()
    assert (delivery.status, delivery.next_attempt_at, delivery.refused_reason) == (DeliveryStatus.FAILED, None, "")
    [attempt] = delivery.attempt_log.all()
    assert attempt.status_code == status
    assert "redirected to http://169.254.169.254/latest/meta-data/" in attempt.error
    assert "not followed" in attempt.error
    assert len(receiver.requests) == 1


# --- shown to the user, and redelivery ---------------------------------------------------------------------------
def test_the_refusal_is_shown_in_the_api_list_and_detail_and_the_admin_list(
    users, client_for, admin_client, no_allowed_networks, sent
):
    endpoint_at(users, "http://169.254.169.254/latest/meta-data/")
    delivery = deliver_one()
    api = client_for("admin")
    [listed] = api.get("/api/v1/webhook-deliveries/").json()["results"]
    detail = api.get(f"/api/v1/webhook-deliveries/{delivery.pk}/").json()
    assert listed["status"] == detail["status"] == "failed"
    assert listed["refused_reason"] == detail["refused_reason"] == delivery.refused_reason
    assert "169.254.169.254" in listed["refused_reason"]
    assert detail["attempt_log"][0]["error"] == delivery.refused_reason
    page = admin_client.get("/admin/webhooks/webhookdelivery/")
    assert page.status_code == 200
    assert "169.254.169.254, a link-local address" in page.content.decode()


def test_a_refused_delivery_is_redelivered_once_the_network_is_allowed(
    users, receiver, settings, queued, django_capture_on_commit_callbacks
):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    endpoint_at(users, receiver.url)
    delivery = deliver_one()
    assert delivery.refused_reason
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with django_capture_on_commit_callbacks(execute=True):
        assert webhook_redeliver(delivery_id=delivery.pk).refused_reason == ""
    assert webhook_deliver(delivery_id=delivery.pk).status == DeliveryStatus.SUCCEEDED
    delivery.refresh_from_db()
    assert delivery.refused_reason == ""
    assert [(a.number, a.status_code) for a in delivery.attempt_log.all()] == [(1, None), (2, 200)]
    assert len(receiver.requests) == 1


# --- refused when saved, where no lookup is needed ---------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hooks",
        "http://169.254.169.254/latest/meta-data/",
        "https://10.0.0.1/hooks",
        "http://[::1]:9000/",
        "http://[::ffff:127.0.0.1]/",
        "http://localhost:8000/hooks",
        "http://api.localhost/hooks",
        # Loopback in the other spellings the resolver reads (inet_aton): refused when saved, not only at delivery.
        "http://0x7f000001/",
        "http://2130706433/",
        "http://127.1:8080/",
        "http://0177.0.0.1/",
        "http://0x7f.1/",
        "http://[0:0:0:0:0:0:0:1]/",
        "http://LOCALHOST./",
    ],
)
def test_creating_an_endpoint_at_a_literal_non_public_address_is_a_400_naming_the_url_field(
    client_for, no_allowed_networks, url
):
    response = client_for("admin").post("/api/v1/webhooks/", {"name": "x", "url": url, "events": ["*"]}, format="json")
    assert response.status_code == 400, response.json()
    assert list(response.json()["fields"]) == ["url"]
    assert "CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS" in response.json()["detail"]
    assert not WebhookEndpoint.objects.exists()


def test_a_link_local_url_is_a_400_even_with_loopback_allowed(client_for):
    response = client_for("admin").post(
        "/api/v1/webhooks/", {"name": "x", "url": "http://169.254.169.254/", "events": ["*"]}, format="json"
    )
    assert response.status_code == 400 and list(response.json()["fields"]) == ["url"]


def test_changing_an_endpoint_to_a_literal_non_public_address_is_a_400(client_for, users, no_allowed_networks):
    endpoint = webhook_endpoint_create(
        created_by=users["admin"], name="x", url="https://hooks.example.com/", events=["*"]
    )
    response = client_for("admin").patch(f"/api/v1/webhooks/{endpoint.pk}/", {"url": "http://10.1.2.3/"}, format="json")
    assert response.status_code == 400 and list(response.json()["fields"]) == ["url"]
    endpoint.refresh_from_db()
    assert endpoint.url == "https://hooks.example.com/"


def test_saving_a_name_makes_no_lookup(client_for, no_allowed_networks, monkeypatch):
    """The save-time check asks the resolver only to read numbers (AI_NUMERICHOST), never to look a name up."""

    def numeric_only(host: Any, port: Any, *args: Any, flags: int = 0, **kwargs: Any) -> Any:
        assert flags & socket.AI_NUMERICHOST, f"saving an endpoint must not look up {host!r}"
        return REAL_GETADDRINFO(host, port, *args, flags=flags, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    response = client_for("admin").post(
        "/api/v1/webhooks/", {"name": "x", "url": "https://hooks.example.com/x", "events": ["*"]}, format="json"
    )
    assert response.status_code == 201


@pytest.mark.parametrize("host", ["0x7f000001", "2130706433", "127.1"])
def test_loopback_in_another_spelling_is_read_the_same_when_saved_and_when_delivered(users, receiver, settings, host):
    """With loopback allowed, the endpoint saves and the delivery reaches the receiver at 127.0.0.1 (the resolver
    that checks at save time reads the host as deliveries do); without it, both refuse."""
    url = f"http://{host}:{receiver.port}/hooks"
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    webhook_endpoint_create(created_by=users["admin"], name="spelled", url=url, events=["*"])
    assert deliver_one().status == DeliveryStatus.SUCCEEDED
    [request] = receiver.requests
    assert request.header("Host") == f"{host}:{receiver.port}"
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(ValidationError, match=f"'{host}', which the resolver reads as 127.0.0.1, a loopback"):
        validate_webhook_url(url)
    WebhookEndpoint.objects.all().delete()
    endpoint_at(users, url)
    assert_refused(deliver_one(), "127.0.0.1", "loopback")
    assert len(receiver.requests) == 1


def test_a_literal_inside_the_allowed_networks_is_accepted(no_allowed_networks, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["10.20.0.0/16"]
    validate_webhook_url("http://10.20.3.4:8080/hooks")
    with pytest.raises(ValidationError, match="10.21.0.1, a private address"):
        validate_webhook_url("http://10.21.0.1:8080/hooks")


# --- the address rules -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "address",
    ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses_are_allowed(no_allowed_networks, address):
    assert egress.address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.255.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",  # Alibaba's metadata service, in the shared (CGNAT) range
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "198.18.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",  # AWS's IPv6 metadata service
        "ff02::1",
        "::ffff:192.168.0.1",
        "::7f00:1",  # IPv4-compatible (deprecated) ::127.0.0.1
        "64:ff9b::7f00:1",
        "2002:7f00:1::",  # 6to4 wrapping 127.0.0.1
        "2001:db8::1",
    ],
)
def test_non_public_addresses_are_refused(no_allowed_networks, address):
    assert egress.address_refusal(ipaddress.ip_address(address)) is not None


def test_allowed_networks_are_matched_through_ipv4_mapped_addresses(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["192.168.0.0/16"]
    assert egress.address_refusal(ipaddress.ip_address("::ffff:192.168.7.7")) is None
    assert egress.address_refusal(ipaddress.ip_address("::ffff:10.0.0.1")) is not None


def test_the_setting_reads_cidrs_from_the_environment_and_refuses_a_bad_one(monkeypatch):
    name = "CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS"
    monkeypatch.delenv(name, raising=False)
    assert env_networks(name, ["127.0.0.0/8"]) == ["127.0.0.0/8"]
    monkeypatch.setenv(name, "")
    assert env_networks(name, ["127.0.0.0/8"]) == []
    monkeypatch.setenv(name, " 10.0.0.0/8, 172.18.0.1/16 ,fd00::/8,192.168.1.5")
    assert env_networks(name, []) == ["10.0.0.0/8", "172.18.0.0/16", "fd00::/8", "192.168.1.5/32"]
    monkeypatch.setenv(name, "10.0.0.0/8,intranet")
    with pytest.raises(SettingError, match="'intranet' is not an IP network"):
        env_networks(name, [])


# --- TLS to a pinned address -------------------------------------------------------------------------------------
def _tls_pair(tmp_path: Path, name: str) -> tuple[Path, Path, str]:
    """A throwaway CA and a server certificate for `name` signed by it: (cert file, key file, CA PEM)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def build(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool) -> Any:
        now = datetime.now(UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("Crucible test CA", ca_key, "Crucible test CA", ca_key, ca=True)
    cert = build(name, key, "Crucible test CA", ca_key, ca=False)
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file, ca_cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture
def tls_receiver(tmp_path, receiver, monkeypatch):  # type: ignore[no-untyped-def]
    """The loopback receiver behind TLS with a certificate for hooks.example.test, and a client that trusts its CA."""
    cert_file, key_file, ca_pem = _tls_pair(tmp_path, "hooks.example.test")
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert_file, key_file)
    receiver.server.socket = server_side.wrap_socket(receiver.server.socket, server_side=True)
    client_side = ssl.create_default_context(cadata=ca_pem)
    monkeypatch.setattr("apps.webhooks.services._transport", lambda: httpx.HTTPTransport(verify=client_side))
    return receiver


def test_https_to_the_checked_address_verifies_the_certificate_against_the_name(users, dns, tls_receiver, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    dns.records["hooks.example.test"] = ["127.0.0.1"]
    dns.records["other.example.test"] = ["127.0.0.1"]
    endpoint_at(users, f"https://hooks.example.test:{tls_receiver.port}/hooks", name="right")
    assert deliver_one().status == DeliveryStatus.SUCCEEDED
    [request] = tls_receiver.requests
    assert request.header("Host") == f"hooks.example.test:{tls_receiver.port}"

    # The same server under a name its certificate does not carry: the check is not skipped for a pinned address.
    WebhookEndpoint.objects.all().delete()
    endpoint_at(users, f"https://other.example.test:{tls_receiver.port}/hooks", name="wrong")
    delivery = deliver_one()
    assert delivery.status == DeliveryStatus.PENDING  # an ordinary connection error: retried
    assert "certificate" in delivery.attempt_log.get().error.lower()
    assert len(tls_receiver.requests) == 1
