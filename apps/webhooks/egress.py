"""Where a webhook may be sent: the server-side request forgery guard.

A webhook URL is typed by a user and the first kilobyte of the answer is shown back to them, so an unchecked URL
reads the cloud metadata service (169.254.169.254), the database's admin port or anything else on the control
plane's network. The guard:

* resolves the host when the delivery is made (`resolve`), not only when the endpoint is saved, and refuses the
  delivery if *any* address the name resolves to is not a public (global unicast) address, unless it lies in one of
  the networks named by WEBHOOK_ALLOWED_NETWORKS (CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS);
* connects to the address it checked (`Target.pinned_url` with the original Host header and TLS server name),
  never to a second resolution, so a name that answers a public address to the check and a private one to the
  connection (DNS rebinding) gets nowhere;
* follows no redirects (services._post), so a public receiver cannot bounce the request inward.

IPv4 addresses inside IPv6 ones (::ffff:a.b.c.d, the NAT64 prefix 64:ff9b::/96, 6to4) are judged by the IPv4
address they carry. Saving an endpoint checks what needs no lookup (`literal_refusal`): a host that is an address in
any spelling the same resolver accepts (`0x7f000001` and `2130706433` are 127.0.0.1 to it), or `localhost`.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

import httpx
from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")
SETTING = "CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS"


class Refused(Exception):
    """The URL points at an address webhooks may not reach; the message says which and why, for the delivery log."""


class Unresolvable(Exception):
    """The host name did not resolve (possibly for now: the delivery is retried)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: the addresses its host resolved to (every one allowed), in the resolver's order."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]

    def pinned_url(self, address: IPAddress) -> httpx.URL:
        """The URL with its host replaced by `address`, so the connection goes where the check looked."""
        return self.url.copy_with(host=str(address))

    @property
    def host_header(self) -> str:
        return self.url.netloc.decode("ascii")

    @property
    def server_name(self) -> str:
        """The name TLS sends (SNI) and checks the certificate against: the URL's host, not the address."""
        return self.url.raw_host.decode("ascii")


@lru_cache(maxsize=16)
def _parse_networks(values: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(value, strict=False) for value in values)


def allowed_networks() -> tuple[IPNetwork, ...]:
    return _parse_networks(tuple(settings.WEBHOOK_ALLOWED_NETWORKS))


def _carried(address: IPAddress) -> IPAddress:
    """The address a packet really goes to: the IPv4 address inside an IPv4-mapped or NAT64 IPv6 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64_PREFIX:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _not_public_because(address: IPAddress) -> str | None:
    """Why `address` is not a public unicast address, or None when it is."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local):
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a reserved or shared address, not a public one"
    if isinstance(address, ipaddress.IPv6Address) and address.sixtofour is not None:
        return _not_public_because(address.sixtofour)
    return None


def address_refusal(address: IPAddress) -> str | None:
    """Why a webhook may not be sent to `address` ("127.0.0.1, a loopback address"), or None when it may: public
    addresses always may, others only inside WEBHOOK_ALLOWED_NETWORKS."""
    carried = _carried(address)
    why = _not_public_because(carried)
    if why is None:
        return None
    if any(carried in network or address in network for network in allowed_networks()):
        return None
    shown = str(address) if carried == address else f"{address} (IPv4 {carried})"
    return f"{shown}, {why}"


def _refused(subject: str) -> Refused:
    return Refused(
        f"refused, not sent: {subject}; webhooks are sent only to public addresses unless {SETTING} includes it"
    )


def numeric_addresses(host: str) -> list[IPAddress]:
    """The addresses a host that is a number stands for, as the resolver deliveries use (getaddrinfo) reads it,
    without a lookup: besides dotted quads and IPv6 that is every form inet_aton takes (`0x7f000001`,
    `2130706433`, `127.1`, `0177.0.0.1`). Empty for a name."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return []
    addresses: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in addresses:
                addresses.append(address)
    return addresses


def literal_refusal(url: str) -> str | None:
    """The check for saving an endpoint, which needs no lookup: a host that is a number in any spelling the
    resolver accepts (`numeric_addresses`), or `localhost`, outside the allowed networks. A name is checked when
    it is resolved, at delivery time."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None  # validate_webhook_url explains what is wrong with it
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        # RFC 6761: these names are loopback (127.0.0.1, often ::1 too: the delivery checks what they resolve to).
        why = address_refusal(ipaddress.IPv4Address("127.0.0.1"))
        return None if why is None else str(_refused(f"{host!r} is {why}"))
    for address in numeric_addresses(host):
        why = address_refusal(address)
        if why is not None:
            shown = why if host == str(address) else f"{host!r}, which the resolver reads as {why}"
            return str(_refused(f"the host is {shown}"))
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def resolve(url: str) -> Target:
    """Resolve the URL's host and check every address it has. Raises Refused (do not send, do not retry) or
    Unresolvable (retry later)."""
    parsed = httpx.URL(url)
    host = parsed.raw_host.decode("ascii")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unresolvable(f"could not resolve {host!r}: {exc}") from None
    addresses: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise Unresolvable(f"{host!r} resolved to no IPv4 or IPv6 address")
    for address in addresses:
        why = address_refusal(address)
        if why is not None:
            literal = ipaddress.ip_address(host) if _is_ip(host) else None
            raise _refused(f"the host is {why}" if literal == address else f"{host!r} resolves to {why}")
    return Target(url=parsed, addresses=tuple(addresses))
