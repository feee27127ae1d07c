//! Where a server is reached, for its start-up lines: the URL of each address it listens on
//! ([`urls`]: loopback, and every LAN address of this machine when it listens on the
//! unspecified address), and a QR code of one of them drawn with Unicode half blocks
//! ([`qr_code`]) for a phone's camera.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The URLs (`scheme://ADDR:PORT/`) a server listening on `local_addr` is reached at: that
/// address itself, or, when it is unspecified (`0.0.0.0`, `::`), loopback first and then each
/// address of this machine's interfaces that are up (IPv4 before IPv6, container bridges last;
/// link-local addresses, which need a zone, are left out; `0.0.0.0` only IPv4 ones).
pub fn urls(local_addr: SocketAddr, scheme: &str) -> Vec<String> {
    let port = local_addr.port();
    let url = |ip: IpAddr| format!("{scheme}://{}/", SocketAddr::new(ip, port));
    let ip = local_addr.ip();
    if !ip.is_unspecified() {
        return vec![url(ip)];
    }
    let loopback = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    let mut urls = vec![url(loopback)];
    urls.extend(lan_addresses(ip.is_ipv6()).into_iter().map(url));
    urls
}

/// This machine's addresses another device may reach: of interfaces that are up, not
/// loopback, not link-local; IPv6 ones only when `with_ipv6` (a `::` listener, dual-stack on
/// Linux). Sorted as [`urls`] says; none when the interfaces cannot be read.
pub fn lan_addresses(with_ipv6: bool) -> Vec<IpAddr> {
    let interfaces = match if_addrs::get_if_addrs() {
        Ok(interfaces) => interfaces,
        Err(error) => {
            tracing::debug!(%error, "cannot list the network interfaces");
            return Vec::new();
        }
    };
    let mut found: Vec<(bool, bool, IpAddr)> = interfaces
        .iter()
        .filter(|interface| {
            interface.oper_status != if_addrs::IfOperStatus::Down && !interface.is_loopback()
        })
        .map(|interface| (interface.name.as_str(), interface.ip()))
        .filter(|(_, ip)| !is_link_local(ip) && (with_ipv6 || ip.is_ipv4()))
        .map(|(name, ip)| (is_bridge(name), ip.is_ipv6(), ip))
        .collect();
    // Stable: the interfaces' own order within each group.
    found.sort_by_key(|(bridge, v6, _)| (*bridge, *v6));
    let mut addresses: Vec<IpAddr> = Vec::new();
    for (_, _, ip) in found {
        if !addresses.contains(&ip) {
            addresses.push(ip);
        }
    }
    addresses
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ip.is_link_local(),
        IpAddr::V6(ip) => (ip.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Interfaces of containers and virtual machines on this host, which a phone does not reach.
fn is_bridge(name: &str) -> bool {
    [
        "docker", "br-", "veth", "virbr", "cni", "podman", "lxc", "vnet",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// `text` as a QR code in Unicode half blocks (two modules a character), light modules drawn
/// as blocks so it reads on a dark terminal, with its quiet zone; `None` if it does not fit
/// in a QR code.
pub fn qr_code(text: &str) -> Option<String> {
    use qrcode::render::unicode::Dense1x2;
    let code = qrcode::QrCode::new(text.as_bytes()).ok()?;
    Some(
        code.render::<Dense1x2>()
            .dark_color(Dense1x2::Light)
            .light_color(Dense1x2::Dark)
            .quiet_zone(true)
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_specific_address_is_its_only_url_and_unspecified_starts_at_loopback() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().expect("address");
        assert_eq!(urls(addr, "https"), ["https://127.0.0.1:8080/"]);
        let addr: SocketAddr = "[::1]:8080".parse().expect("address");
        assert_eq!(urls(addr, "http"), ["http://[::1]:8080/"]);
        let any: SocketAddr = "0.0.0.0:8443".parse().expect("address");
        let all = urls(any, "https");
        assert_eq!(all[0], "https://127.0.0.1:8443/");
        for url in &all[1..] {
            let host = url
                .strip_prefix("https://")
                .and_then(|rest| rest.strip_suffix(":8443/"))
                .expect("the URL shape");
            let ip: IpAddr = host.parse().expect("an address");
            assert!(ip.is_ipv4() && !ip.is_loopback(), "{url}");
        }
    }

    #[test]
    fn the_qr_code_is_half_blocks_with_a_quiet_zone() {
        let code = qr_code("http://192.168.1.5:8080/").expect("fits");
        let lines: Vec<&str> = code.lines().collect();
        // Version 2 (25 modules) with a 4-module quiet zone: 33 columns, 17 rows of two.
        assert!(lines.len() >= 15, "{code}");
        assert!(
            lines
                .iter()
                .all(|line| line.chars().count() == lines[0].chars().count())
        );
        assert!(
            code.chars()
                .all(|c| matches!(c, '█' | '▀' | '▄' | ' ' | '\n')),
            "{code}"
        );
    }
}
