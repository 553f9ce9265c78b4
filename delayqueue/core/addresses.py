"""Client addresses as the per-address limits count them (failed API tokens, failed admin logins),
and the IPv4 address an IPv6 one carries (which push hosts are allowed judges that one too).

An IPv6 client counts as its /64: the least a network hands one site or host (SLAAC gives every
host a /64 of its own), so whoever holds one address holds 2^64, and counting each apart would
give them as many fresh starts. An IPv4 client counts per address, also when it arrives as an
IPv6 address carrying its IPv4 one (a dual-stack socket's IPv4-mapped form, NAT64 / SIIT, 6to4):
by their /64, every IPv4 client behind one translator would be one."""
import ipaddress

IPV6_PREFIX = 64
# IPv6 addresses that carry an IPv4 one a network may route to, in their low 32 bits: NAT64's
# well-known prefix, IPv4-translated (SIIT, ::ffff:0:a.b.c.d) and the old IPv4-compatible form
# (::a.b.c.d); IPv4-mapped and 6to4 have ipaddress' own properties.
_CARRYING_IPV4 = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "::ffff:0:0:0/96", "::/96"))


def carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address the IPv6 one carries (see _CARRYING_IPV4), None if it carries none."""
    carried = address.ipv4_mapped or address.sixtofour
    if carried is None and any(address in network for network in _CARRYING_IPV4):
        carried = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return carried


def counted_address(address: str) -> str:
    """The address as a limit counts it: an IPv4 address itself (also one an IPv6 address carries),
    any other IPv6 address its /64 network; anything else (no address: a Unix socket's peer) as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        carried = carried_ipv4(ip)
        if carried is None:
            host_bits = 128 - IPV6_PREFIX
            return str(ipaddress.IPv6Network((int(ip) >> host_bits << host_bits, IPV6_PREFIX)))
        ip = carried
    return str(ip)
