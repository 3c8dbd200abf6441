//! Blocks of addresses (`127.0.0.0/8`, `::1/128`) and the list of them
//! that says which peers may send a PROXY protocol header
//! (`--accept-proxy-from`, loopback by default).
//!
//! # Threads
//!
//! Plain values, read by the workers. No C counterpart.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use super::codec::ParseError;

/// A block of addresses, `ADDRESS/PREFIX`: `127.0.0.0/8`, `::1/128`.
///
/// The address is kept with its host bits cleared, so `10.1.2.3/8` is
/// `10.0.0.0/8`. An IPv4-mapped IPv6 block (`::ffff:10.0.0.0/104`) is kept
/// as the IPv4 block it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The first address of the block.
    network: IpAddr,
    /// How many leading bits are fixed: 0..=32 for IPv4, 0..=128 for IPv6.
    prefix: u8,
}

impl Cidr {
    /// The block `network/prefix`, host bits cleared; `None` if `prefix` is
    /// longer than the address.
    pub fn new(network: IpAddr, prefix: u8) -> Option<Cidr> {
        match network {
            IpAddr::V4(v4) if prefix <= 32 => Some(Cidr {
                network: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
                prefix,
            }),
            IpAddr::V6(v6) if prefix <= 128 => match v6.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Cidr::new(IpAddr::V4(v4), prefix - 96),
                _ => Some(Cidr {
                    network: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
                    prefix,
                }),
            },
            _ => None,
        }
    }

    /// Whether `ip` is in the block. An IPv4-mapped IPv6 address
    /// (`::ffff:127.0.0.1`, an IPv4 client on a dual-stack socket) is
    /// compared as the IPv4 address it maps, so IPv4 blocks match it; an IPv6
    /// block never matches an IPv4 client, not even `::/0` (write
    /// `0.0.0.0/0` for those).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        match (self.network, ip) {
            (IpAddr::V4(network), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(network)
            }
            (IpAddr::V6(network), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(network)
            }
            _ => false,
        }
    }
}

/// The netmask of an IPv4 `/prefix` (`prefix` at most 32).
fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The netmask of an IPv6 `/prefix` (`prefix` at most 128).
fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = ParseError;

    /// Parses `ADDRESS/PREFIX`, or a bare address (a block of one: `/32`
    /// or `/128`).
    fn from_str(text: &str) -> Result<Cidr, ParseError> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.parse().map_err(|_| {
            ParseError(format!(
                "'{text}': '{address}' is not an IPv4 or IPv6 address"
            ))
        })?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max && prefix.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    ParseError(format!("'{text}': the prefix length must be 0..={max}"))
                })?,
        };
        // The prefix was checked against the family just above.
        Cidr::new(network, prefix)
            .ok_or_else(|| ParseError(format!("'{text}': the prefix length must be 0..={max}")))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The peers trusted to send a PROXY protocol header: a list of [`Cidr`]s.
///
/// Only a peer in the list may tell the balancer who the client is; a header
/// from anyone else is refused, since believing it would let any client
/// pass for any address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CidrList(Vec<Cidr>);

impl CidrList {
    /// `127.0.0.0/8` and `::1/128`: this host only, the default of
    /// `--accept-proxy-from`.
    pub fn loopback() -> CidrList {
        CidrList(vec![
            Cidr {
                network: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                prefix: 8,
            },
            Cidr {
                network: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ])
    }

    /// Whether `ip` is in any block of the list.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// The blocks, in the order given.
    pub fn cidrs(&self) -> &[Cidr] {
        &self.0
    }
}

impl From<Vec<Cidr>> for CidrList {
    fn from(cidrs: Vec<Cidr>) -> CidrList {
        CidrList(cidrs)
    }
}

impl FromStr for CidrList {
    type Err = ParseError;

    /// Parses a comma-separated list, `127.0.0.0/8, 10.0.0.0/8,::1`; spaces
    /// around the commas are allowed, empty items are not.
    fn from_str(text: &str) -> Result<CidrList, ParseError> {
        if text.trim().is_empty() {
            return Err(ParseError(
                "an empty address list (expected e.g. 127.0.0.0/8,::1/128)".to_string(),
            ));
        }
        text.split(',')
            .map(|item| {
                if item.trim().is_empty() {
                    Err(ParseError(format!("'{text}': an empty item in the list")))
                } else {
                    item.parse()
                }
            })
            .collect::<Result<Vec<Cidr>, ParseError>>()
            .map(CidrList)
    }
}

impl fmt::Display for CidrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, cidr) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{cidr}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn cidr_parses_and_contains() {
        let net: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.255.0.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(
            net.contains(ip("::ffff:10.9.9.9")),
            "mapped peers match IPv4 blocks"
        );
        assert!(!net.contains(ip("::1")));

        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));

        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");

        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.255.255.255")));
        let mapped: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(mapped.to_string(), "10.0.0.0/8");

        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "localhost",
            "",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn cidr_list_parses_and_defaults_to_loopback() {
        let list: CidrList = "10.0.0.0/8, 192.0.2.1 ,::1".parse().unwrap();
        assert_eq!(list.to_string(), "10.0.0.0/8,192.0.2.1/32,::1/128");
        assert!(list.contains(ip("10.2.3.4")));
        assert!(list.contains(ip("::1")));
        assert!(!list.contains(ip("127.0.0.1")));
        assert!("10.0.0.0/8,,::1".parse::<CidrList>().is_err());
        assert!(" ".parse::<CidrList>().is_err());
        assert!("10.0.0.0/8,nope".parse::<CidrList>().is_err());

        let loopback = CidrList::loopback();
        assert_eq!(loopback.to_string(), "127.0.0.0/8,::1/128");
        assert!(loopback.contains(ip("127.0.0.1")));
        assert!(loopback.contains(ip("127.9.9.9")));
        assert!(loopback.contains(ip("::ffff:127.0.0.1")));
        assert!(loopback.contains(ip("::1")));
        assert!(!loopback.contains(ip("192.0.2.1")));
    }
}
