"""Client addresses as the per-address limits count them (failed API tokens, failed admin logins).

An IPv6 client counts as its /64: the least a network hands one site or host (SLAAC gives every
host a /64 of its own), so whoever holds one address holds 2^64, and counting each apart would
give them as many fresh starts. IPv4, also an IPv4 address mapped into IPv6 (a dual-stack
socket's), counts per address."""
import ipaddress

IPV6_PREFIX = 64


def counted_address(address: str) -> str:
    """The address as a limit counts it: an IPv6 address' /64 network, an IPv4 address itself;
    anything else (no address: a Unix socket's peer) as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    host_bits = 128 - IPV6_PREFIX
    return str(ipaddress.IPv6Network((int(ip) >> host_bits << host_bits, IPV6_PREFIX)))
