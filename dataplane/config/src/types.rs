//! Value types that appear in the schema: MAC addresses and IP interface addresses.
//!
//! Each parses from the string form used in the TOML file and reports a one-line error that
//! quotes the bad input (`invalid MAC "zz"`), so the loader can prefix it with the key path.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A 48-bit Ethernet MAC address, written `02:00:c6:12:00:01` (`-` also accepted).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The all-zero address.
    pub const ZERO: MacAddr = MacAddr([0; 6]);
    /// The broadcast address.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// The six octets.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
    /// True for a group (multicast/broadcast) address: bit 0 of the first octet.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid MAC {s:?}");
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || p.len() > 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// An IPv4 interface address with prefix length, written `198.18.0.1/24` (`/32` if omitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    /// The interface address.
    pub addr: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub prefix: u8,
}

impl Ipv4Cidr {
    /// True when `other` is on this interface's subnet.
    pub fn contains(&self, other: Ipv4Addr) -> bool {
        if self.prefix == 0 {
            return true;
        }
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        (u32::from(self.addr) & mask) == (u32::from(other) & mask)
    }
}

/// An IPv6 interface address with prefix length, written `fd00::1/64` (`/128` if omitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Cidr {
    /// The interface address.
    pub addr: Ipv6Addr,
    /// Prefix length, 0..=128.
    pub prefix: u8,
}

fn split_cidr<'a>(s: &'a str, max: u8, what: &str) -> Result<(&'a str, u8), String> {
    match s.split_once('/') {
        None => Ok((s, max)),
        Some((a, p)) => {
            let prefix: u8 = p.parse().map_err(|_| format!("invalid {what} prefix length in {s:?}"))?;
            if prefix > max {
                return Err(format!("invalid {what} prefix length in {s:?} (max {max})"));
            }
            Ok((a, prefix))
        }
    }
}

impl FromStr for Ipv4Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, prefix) = split_cidr(s, 32, "IPv4")?;
        let addr = a.parse().map_err(|_| format!("invalid IPv4 address {s:?}"))?;
        Ok(Ipv4Cidr { addr, prefix })
    }
}

impl FromStr for Ipv6Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, prefix) = split_cidr(s, 128, "IPv6")?;
        let addr = a.parse().map_err(|_| format!("invalid IPv6 address {s:?}"))?;
        Ok(Ipv6Cidr { addr, prefix })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Parses an IP address (v4 or v6) with a one-line error quoting the input.
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("invalid IP address {s:?}"))
}

/// Serde glue: string in, `FromStr` out, error message passed through unchanged.
macro_rules! serde_via_str {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(de::Error::custom)
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}
serde_via_str!(MacAddr, Ipv4Cidr, Ipv6Cidr);

/// `deserialize_with` helper for a bare [`IpAddr`] with our error message.
pub(crate) fn de_ip<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    let s = String::deserialize(d)?;
    parse_ip(&s).map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_roundtrip() {
        let m: MacAddr = "02:00:C6:12:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 0, 0xc6, 0x12, 0, 1]);
        assert_eq!(m.to_string(), "02:00:c6:12:00:01");
        assert_eq!("02-00-c6-12-00-01".parse::<MacAddr>().unwrap(), m);
    }

    #[test]
    fn mac_rejects() {
        for bad in ["zz", "", "02:00:c6:12:00", "02:00:c6:12:00:01:02", "002:00:c6:12:00:01", "02::c6:12:00:01"] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert_eq!(e, format!("invalid MAC {bad:?}"));
        }
    }

    #[test]
    fn cidr() {
        let c: Ipv4Cidr = "198.18.0.1/24".parse().unwrap();
        assert_eq!(c.addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(c.prefix, 24);
        assert!(c.contains(Ipv4Addr::new(198, 18, 0, 200)));
        assert!(!c.contains(Ipv4Addr::new(198, 18, 1, 1)));
        assert_eq!("10.0.0.1".parse::<Ipv4Cidr>().unwrap().prefix, 32);
        assert!("10.0.0.1/33".parse::<Ipv4Cidr>().is_err());
        assert!("10.0.0/8".parse::<Ipv4Cidr>().is_err());
        assert_eq!("fd00::1/64".parse::<Ipv6Cidr>().unwrap().prefix, 64);
        assert!("fd00::g".parse::<Ipv6Cidr>().is_err());
    }
}
