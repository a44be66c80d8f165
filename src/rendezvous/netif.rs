//! Local network interfaces: which address the data listener should bind.

use crate::bail;
use crate::error::{Error, Result, Status};
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub addr: IpAddr,
    pub up: bool,
    pub loopback: bool,
}

/// Lists the IPv4 and IPv6 addresses of this host's interfaces (`getifaddrs`).
pub fn interfaces() -> Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::system("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: ifa_addr is non-null; sa_family says which sockaddr type it points to.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let flags = ifa.ifa_flags as libc::c_int;
        out.push(IfAddr {
            name,
            addr,
            up: flags & libc::IFF_UP != 0,
            loopback: flags & libc::IFF_LOOPBACK != 0,
        });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn is_link_local_v6(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// The address of interface `name` (`DC_SOCKET_IFNAME`): an exact name first, else the first
/// interface whose name starts with `name` (`eth` matches `eth0`). IPv4 is preferred unless
/// `prefer_v6`; IPv6 link-local addresses are skipped (they need a scope to bind).
pub fn interface_addr(name: &str, prefer_v6: bool) -> Result<IpAddr> {
    let all = interfaces()?;
    let usable = |i: &&IfAddr| !is_link_local_v6(&i.addr);
    let pick = |cands: Vec<&IfAddr>| -> Option<IpAddr> {
        let want_v6 = |a: &IpAddr| a.is_ipv6() == prefer_v6;
        cands.iter().find(|i| want_v6(&i.addr)).or(cands.first()).map(|i| i.addr)
    };
    let exact: Vec<&IfAddr> = all.iter().filter(|i| i.name == name).filter(usable).collect();
    if let Some(a) = pick(exact) {
        return Ok(a);
    }
    let prefixed: Vec<&IfAddr> =
        all.iter().filter(|i| i.up && i.name.starts_with(name)).filter(usable).collect();
    if let Some(a) = pick(prefixed) {
        return Ok(a);
    }
    let mut names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
    names.dedup();
    bail!(
        Status::InvalidArgument,
        "DC_SOCKET_IFNAME={name}: no interface of that name with an IP address (this host has: {})",
        names.join(", ")
    );
}

/// The first up, non-loopback IPv4 address of this host.
pub fn first_non_loopback_ipv4() -> Option<IpAddr> {
    interfaces().ok()?.into_iter().find(|i| i.up && !i.loopback && i.addr.is_ipv4()).map(|i| i.addr)
}

/// The local address the kernel would use to reach `peer` (a connected UDP socket sends nothing).
pub fn route_to(peer: SocketAddr) -> std::io::Result<IpAddr> {
    let bind: SocketAddr = match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(peer)?;
    Ok(sock.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_and_routes_to_itself() {
        let all = interfaces().unwrap();
        assert!(all.iter().any(|i| i.loopback && i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)), "{all:?}");
        let lo = all.iter().find(|i| i.loopback && i.addr.is_ipv4()).unwrap();
        assert_eq!(interface_addr(&lo.name, false).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(
            route_to("127.0.0.1:29500".parse().unwrap()).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        let e = interface_addr("no-such-if0", false).unwrap_err();
        assert!(e.msg.contains("DC_SOCKET_IFNAME=no-such-if0"), "{}", e.msg);
    }
}
