//! [`Key`]: whose requests a limited route counts together, read from the request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName, StatusCode};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tollgate_limiter::keyspace::secret_digest;

/// Why a [`Key`] could not be read from a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// No peer address in the request's extensions.
    #[error(
        "the connection's peer address is unknown: serve the app with ConnectInfo<SocketAddr> \
         (axum: into_make_service_with_connect_info) or put the SocketAddr in the request's extensions"
    )]
    NoPeerAddress,
    /// A trusted proxy's forwarding header holds an entry that is not an address.
    #[error("the {header} header from a trusted proxy holds {value:?}, which is not an IP address")]
    BadForwardedHeader {
        /// The header.
        header: &'static str,
        /// The entry.
        value: String,
    },
    /// The header the key is read from is absent.
    #[error("the {0} header is missing")]
    MissingHeader(HeaderName),
    /// The header is empty, or not visible ASCII, or not in the expected form.
    #[error("the {0} header is empty or malformed")]
    InvalidHeader(HeaderName),
    /// The identity an earlier layer should have put in the request's extensions is absent.
    #[error("the request carries no {0}: the layer that authenticates must run before this one")]
    MissingIdentity(&'static str),
    /// A custom extractor's refusal.
    #[error("{0}")]
    Custom(String),
}

impl ExtractError {
    /// A refusal from a [`Key::from_fn`] closure.
    pub fn custom(message: impl Into<String>) -> Self {
        ExtractError::Custom(message.into())
    }
}

/// What a request whose key cannot be read is answered (when no fallback key is given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// 400 Bad Request (gRPC: `INVALID_ARGUMENT`).
    BadRequest,
    /// 401 Unauthorized (gRPC: `UNAUTHENTICATED`).
    Unauthorized,
}

impl Rejection {
    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Rejection::BadRequest => StatusCode::BAD_REQUEST,
            Rejection::Unauthorized => StatusCode::UNAUTHORIZED,
        }
    }
}

/// How addresses are grouped into keys: one key per IPv4 address by default, and one per IPv6
/// /56, since one IPv6 subscriber usually gets a whole /56 (or /48, or /64) and could otherwise
/// rotate through addresses to escape any limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpGrouping {
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Default for IpGrouping {
    fn default() -> Self {
        IpGrouping { ipv4_prefix: 32, ipv6_prefix: 56 }
    }
}

impl IpGrouping {
    /// /32 for IPv4, /56 for IPv6.
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups IPv6 addresses by their first `bits` bits (at most 128).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by their first `bits` bits (at most 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.ipv4_prefix = bits.min(32);
        self
    }

    /// The key text for `ip`: the address, or its network when grouped (`2001:db8:0:100::/56`).
    /// IPv4-mapped IPv6 addresses (from dual-stack sockets) count as their IPv4 address.
    pub fn key_of(&self, ip: IpAddr) -> String {
        let mut out = String::with_capacity(43);
        self.write_key(&mut out, ip);
        out
    }

    /// [`key_of`](Self::key_of), appended to `out`.
    fn write_key(&self, out: &mut String, ip: IpAddr) {
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = match ip.to_canonical() {
            // By hand: `Ipv4Addr`'s Display goes through core::fmt, about a fifth of the
            // layer's own cost per request.
            IpAddr::V4(a) if self.ipv4_prefix == 32 => {
                for (i, octet) in a.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    out.push_str(itoa::Buffer::new().format(octet));
                }
                Ok(())
            }
            IpAddr::V4(a) => write!(out, "{}", Ipv4Net::new_assert(a, self.ipv4_prefix).trunc()),
            IpAddr::V6(a) if self.ipv6_prefix == 128 => write!(out, "{a}"),
            IpAddr::V6(a) => write!(out, "{}", Ipv6Net::new_assert(a, self.ipv6_prefix).trunc()),
        };
    }

    /// The key of an address: `ip:` and [`key_of`](Self::key_of).
    fn ip_key(&self, ip: IpAddr) -> String {
        let mut out = String::with_capacity(46);
        out.push_str("ip:");
        self.write_key(&mut out, ip);
        out
    }
}

/// The forwarding header a trusted proxy writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (each proxy appends the address it got the
    /// request from).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`: one address, set (not appended) by the proxy.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
            ForwardedHeader::XRealIp => "x-real-ip",
        }
    }
}

/// The proxies whose forwarding header is believed, and which header they write.
///
/// Only one header is read: a proxy that writes `X-Forwarded-For` passes a client's own
/// `Forwarded` header through untouched, so reading any header the proxy does not write would
/// let the client choose its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
    grouping: IpGrouping,
}

/// A trusted-proxy entry that is neither an address nor a CIDR block.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an IP address or a CIDR block such as 10.0.0.0/8")]
pub struct CidrError {
    /// The text given.
    pub input: String,
    /// Why it is not a CIDR block.
    #[source]
    pub reason: std::net::AddrParseError,
}

impl TrustedProxies {
    /// Proxies in `nets`, writing `X-Forwarded-For`.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        TrustedProxies {
            nets: nets.into_iter().map(|n| n.trunc()).collect(),
            header: ForwardedHeader::default(),
            grouping: IpGrouping::default(),
        }
    }

    /// Proxies from text: CIDR blocks (`10.0.0.0/8`, `fd00::/8`) or single addresses.
    pub fn parse<S: AsRef<str>>(nets: impl IntoIterator<Item = S>) -> Result<Self, CidrError> {
        let nets = nets
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|reason| CidrError { input: s.to_owned(), reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(nets))
    }

    /// The header the proxies write (default `X-Forwarded-For`).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// How client addresses are grouped into keys (default: IPv6 by /56).
    pub fn grouping(mut self, grouping: IpGrouping) -> Self {
        self.grouping = grouping;
        self
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client's address: the peer itself unless it is a trusted proxy; then, walking the
    /// header's hops from the right (the hop the proxy itself added), the first address that is
    /// not a trusted proxy. Hops left of it were written by the client and are ignored; taking the
    /// leftmost would let any client choose its own key.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, ExtractError> {
        let mut ip = peer.to_canonical();
        if !self.trusts(ip) {
            return Ok(ip);
        }
        let name = self.header.name();
        let mut text = String::new();
        for value in headers.get_all(name) {
            let value = value.to_str().map_err(|_| ExtractError::BadForwardedHeader {
                header: name,
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })?;
            if !text.is_empty() {
                text.push(',');
            }
            text.push_str(value);
        }
        let hops: Vec<&str> = match self.header {
            ForwardedHeader::XForwardedFor => text.split(',').collect(),
            ForwardedHeader::XRealIp => vec![text.as_str()],
            ForwardedHeader::Forwarded => forwarded_for(&text),
        };
        for hop in hops.iter().rev().map(|h| h.trim()) {
            if hop.is_empty() && self.header != ForwardedHeader::Forwarded {
                continue;
            }
            ip = parse_hop(hop)
                .ok_or_else(|| ExtractError::BadForwardedHeader { header: name, value: hop.to_owned() })?
                .to_canonical();
            if !self.trusts(ip) {
                return Ok(ip);
            }
        }
        // Every hop is a trusted proxy (or there is none): the leftmost one known.
        Ok(ip)
    }
}

/// The `for=` values of a `Forwarded` header, in order (elements without one are skipped).
fn forwarded_for(text: &str) -> Vec<&str> {
    split_unquoted(text, ',')
        .into_iter()
        .filter_map(|element| {
            split_unquoted(element, ';').into_iter().find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim().eq_ignore_ascii_case("for").then(|| value.trim().trim_matches('"'))
            })
        })
        .collect()
}

/// `text` split at `sep` outside double quotes.
fn split_unquoted(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// An address as proxies write it: bare, with a port, or bracketed IPv6 with or without one.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    hop.strip_prefix('[')?.split(']').next()?.parse().ok()
}

/// The connection's peer address, from axum's `ConnectInfo<SocketAddr>` or a `SocketAddr`
/// in the request's extensions.
pub fn peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    extensions.get::<SocketAddr>().copied()
}

type ExtensionFn = dyn Fn(&Extensions) -> Option<String> + Send + Sync;
type CustomFn = dyn Fn(&Parts) -> Result<String, ExtractError> + Send + Sync;

#[derive(Clone)]
enum Source {
    PeerIp(IpGrouping),
    ClientIp(Arc<TrustedProxies>),
    Header(HeaderName),
    Bearer,
    Extension(&'static str, Arc<ExtensionFn>),
    Global,
    Custom(Arc<CustomFn>),
}

/// Whose requests are counted together: a request's key, read from the request.
///
/// Built from one source ([`peer_ip`](Key::peer_ip), [`client_ip`](Key::client_ip),
/// [`header`](Key::header), [`bearer_token`](Key::bearer_token),
/// [`extension`](Key::extension), [`global`](Key::global), [`from_fn`](Key::from_fn)), then
/// optionally [`or`](Key::or) a fallback tried when it cannot be read, and
/// [`reject_with`](Key::reject_with) the status answered when none can.
///
/// ```
/// use tollgate_tower::{Key, Rejection, TrustedProxies};
///
/// // The API key when there is one, else the client's address behind the load balancer.
/// let proxies = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
/// let key = Key::header("x-api-key").or(Key::client_ip(proxies));
/// // Or: an API key is required.
/// let strict = Key::header("x-api-key").reject_with(Rejection::Unauthorized);
/// ```
#[derive(Clone)]
pub struct Key {
    source: Source,
    rejection: Rejection,
    fallback: Option<Box<Key>>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::PeerIp(g) => format!("PeerIp({g:?})"),
            Source::ClientIp(t) => format!("ClientIp({t:?})"),
            Source::Header(h) => format!("Header({h})"),
            Source::Bearer => "BearerToken".into(),
            Source::Extension(t, _) => format!("Extension({t})"),
            Source::Global => "Global".into(),
            Source::Custom(_) => "Custom".into(),
        };
        f.debug_struct("Key")
            .field("source", &source)
            .field("rejection", &self.rejection)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Key {
    fn of(source: Source, rejection: Rejection) -> Self {
        Key { source, rejection, fallback: None }
    }

    /// The connection's peer address (IPv6 grouped by /56). Behind a proxy or load balancer
    /// every request has the proxy's address: use [`client_ip`](Key::client_ip) there.
    pub fn peer_ip() -> Self {
        Self::peer_ip_grouped(IpGrouping::default())
    }

    /// The peer address, grouped as given.
    pub fn peer_ip_grouped(grouping: IpGrouping) -> Self {
        Self::of(Source::PeerIp(grouping), Rejection::BadRequest)
    }

    /// The client's address behind trusted proxies (see [`TrustedProxies::client_ip`]); the
    /// peer address itself when the peer is not a trusted proxy.
    pub fn client_ip(proxies: TrustedProxies) -> Self {
        Self::of(Source::ClientIp(Arc::new(proxies)), Rejection::BadRequest)
    }

    /// A header's value (such as an API key), hashed. Missing: 401 unless a fallback is given.
    ///
    /// # Panics
    /// If `name` is not a valid lowercase header name (as [`HeaderName::from_static`]).
    pub fn header(name: &'static str) -> Self {
        Self::header_name(HeaderName::from_static(name))
    }

    /// Like [`header`](Key::header), with a [`HeaderName`].
    pub fn header_name(name: HeaderName) -> Self {
        Self::of(Source::Header(name), Rejection::Unauthorized)
    }

    /// The token of an `Authorization: Bearer <token>` header, hashed.
    pub fn bearer_token() -> Self {
        Self::of(Source::Bearer, Rejection::Unauthorized)
    }

    /// An identity an earlier layer (authentication) put in the request's extensions, as
    /// text: `Key::extension(|user: &UserId| user.0.to_string())`. Missing: 401.
    pub fn extension<T, F>(to_key: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        let read = move |ext: &Extensions| ext.get::<T>().map(&to_key);
        Self::of(Source::Extension(std::any::type_name::<T>(), Arc::new(read)), Rejection::Unauthorized)
    }

    /// One key for every request: the route's limit is shared by all clients.
    pub fn global() -> Self {
        Self::of(Source::Global, Rejection::BadRequest)
    }

    /// Anything else: a closure over the request's head. Refusals are
    /// [`ExtractError::custom`]; 400 unless a fallback is given.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> Result<String, ExtractError> + Send + Sync + 'static,
    {
        Self::of(Source::Custom(Arc::new(f)), Rejection::BadRequest)
    }

    /// Tries `fallback` when this key cannot be read (after any fallbacks already given).
    pub fn or(mut self, fallback: Key) -> Self {
        self.fallback = Some(Box::new(match self.fallback.take() {
            Some(existing) => existing.or(fallback),
            None => fallback,
        }));
        self
    }

    /// What a request is answered when this key (and its fallbacks) cannot be read. The last
    /// key tried decides.
    pub fn reject_with(mut self, rejection: Rejection) -> Self {
        match &mut self.fallback {
            Some(f) => **f = f.as_ref().clone().reject_with(rejection),
            None => self.rejection = rejection,
        }
        self
    }

    /// The request's key, or why none could be read and how to answer.
    pub fn extract(&self, parts: &Parts) -> Result<String, (ExtractError, Rejection)> {
        match self.read(parts) {
            Ok(key) => Ok(key),
            Err(e) => match &self.fallback {
                Some(fallback) => fallback.extract(parts),
                None => Err((e, self.rejection)),
            },
        }
    }

    fn read(&self, parts: &Parts) -> Result<String, ExtractError> {
        match &self.source {
            Source::PeerIp(grouping) => {
                let peer = peer_addr(&parts.extensions).ok_or(ExtractError::NoPeerAddress)?;
                Ok(grouping.ip_key(peer.ip()))
            }
            Source::ClientIp(proxies) => {
                let peer = peer_addr(&parts.extensions).ok_or(ExtractError::NoPeerAddress)?;
                let ip = proxies.client_ip(peer.ip(), &parts.headers)?;
                Ok(proxies.grouping.ip_key(ip))
            }
            Source::Header(name) => {
                let value =
                    parts.headers.get(name).ok_or_else(|| ExtractError::MissingHeader(name.clone()))?;
                let value = value.as_bytes().trim_ascii();
                if value.is_empty() {
                    return Err(ExtractError::InvalidHeader(name.clone()));
                }
                // Header values and tokens may be secrets, which must not land in a backend.
                Ok(format!("hdr:{name}:{}", secret_digest(value)))
            }
            Source::Bearer => {
                let name = http::header::AUTHORIZATION;
                let value =
                    parts.headers.get(&name).ok_or_else(|| ExtractError::MissingHeader(name.clone()))?;
                let token = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, token)| token.trim())
                    .filter(|t| !t.is_empty())
                    .ok_or(ExtractError::InvalidHeader(name))?;
                Ok(format!("bearer:{}", secret_digest(token.as_bytes())))
            }
            Source::Extension(type_name, read) => {
                let id = read(&parts.extensions).ok_or(ExtractError::MissingIdentity(type_name))?;
                Ok(format!("id:{id}"))
            }
            Source::Global => Ok("global".to_owned()),
            Source::Custom(f) => f(parts).map(|k| format!("fn:{k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut req = http::Request::builder().uri("/");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let mut req = req.body(()).unwrap();
        if !peer.is_empty() {
            req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
        }
        req.into_parts().0
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::parse(["10.0.0.0/8", "fd00::/8", "192.0.2.1"]).unwrap()
    }

    #[test]
    fn ipv6_is_grouped_by_56_and_mapped_ipv4_is_ipv4() {
        let g = IpGrouping::default();
        assert_eq!(g.key_of("2001:db8:1:2ff:aaaa::1".parse().unwrap()), "2001:db8:1:200::/56");
        assert_eq!(g.key_of("2001:db8:1:2ab::9".parse().unwrap()), "2001:db8:1:200::/56");
        assert_eq!(g.key_of("::ffff:203.0.113.9".parse().unwrap()), "203.0.113.9");
        assert_eq!(g.ipv6_prefix(64).key_of("2001:db8:1:2ff::1".parse().unwrap()), "2001:db8:1:2ff::/64");
        assert_eq!(g.ipv4_prefix(24).key_of("203.0.113.9".parse().unwrap()), "203.0.113.0/24");
        let key = Key::peer_ip();
        let a = key.extract(&parts("[2001:db8:1:2ff::1]:5000", &[])).unwrap();
        let b = key.extract(&parts("[2001:db8:1:200::7]:6000", &[])).unwrap();
        let c = key.extract(&parts("[2001:db8:1:300::1]:5000", &[])).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    proptest::proptest! {
        /// The hand-written IPv4 key is the address's own dotted quad, and IPv6 keys are its
        /// Display, whatever the address.
        #[test]
        fn address_keys_are_the_addresses_text(v4: u32, v6: u128) {
            let g = IpGrouping::default().ipv6_prefix(128);
            let a = std::net::Ipv4Addr::from(v4);
            proptest::prop_assert_eq!(g.key_of(a.into()), a.to_string());
            let b = std::net::Ipv6Addr::from(v6);
            let expected = b.to_canonical().to_string();
            proptest::prop_assert_eq!(g.key_of(b.into()), expected);
        }
    }

    #[test]
    fn forwarding_headers_from_untrusted_peers_are_ignored() {
        let key = Key::client_ip(proxies());
        let p = parts("203.0.113.7:1234", &[("x-forwarded-for", "198.51.100.1"), ("x-real-ip", "1.1.1.1")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.7");
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let key = Key::client_ip(proxies());
        // The client forged the first entry; the proxies appended the real hops.
        let p = parts("10.0.0.2:80", &[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.7");
        // Several header lines count as one list, in order.
        let p = parts(
            "10.0.0.2:80",
            &[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "203.0.113.8:5555, 10.1.1.1")],
        );
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.8");
        // Every hop trusted: the leftmost.
        let p = parts("10.0.0.2:80", &[("x-forwarded-for", "10.9.9.9, 192.0.2.1")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:10.9.9.9");
        // No header at all: the proxy itself.
        assert_eq!(key.extract(&parts("10.0.0.2:80", &[])).unwrap(), "ip:10.0.0.2");
    }

    #[test]
    fn only_the_configured_header_is_read() {
        // The proxy writes X-Forwarded-For; a client-supplied Forwarded header is not believed.
        let key = Key::client_ip(proxies());
        let p = parts("10.0.0.2:80", &[("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.7");
    }

    #[test]
    fn forwarded_and_x_real_ip() {
        let key = Key::client_ip(proxies().header(ForwardedHeader::Forwarded));
        let p = parts(
            "[fd00::1]:80",
            &[("forwarded", r#"for=6.6.6.6, For="[2001:db8:cafe::17]:4711";proto=https, for=10.2.2.2;by=x"#)],
        );
        assert_eq!(key.extract(&p).unwrap(), "ip:2001:db8:cafe::/56");
        let key = Key::client_ip(proxies().header(ForwardedHeader::XRealIp));
        let p = parts("10.0.0.2:80", &[("x-real-ip", "203.0.113.9")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.9");
    }

    #[test]
    fn garbage_from_a_trusted_proxy_is_a_typed_error() {
        let key = Key::client_ip(proxies());
        let p = parts("10.0.0.2:80", &[("x-forwarded-for", "unknown")]);
        let (e, rejection) = key.extract(&p).unwrap_err();
        assert!(matches!(e, ExtractError::BadForwardedHeader { header: "x-forwarded-for", .. }), "{e}");
        assert_eq!(rejection, Rejection::BadRequest);
        // Garbage left of the client's address (the client's own) does not matter.
        let p = parts("10.0.0.2:80", &[("x-forwarded-for", "garbage, 203.0.113.7")]);
        assert_eq!(key.extract(&p).unwrap(), "ip:203.0.113.7");
    }

    #[test]
    fn headers_are_hashed_and_fall_back() {
        let key = Key::header("x-api-key");
        let k = key.extract(&parts("", &[("x-api-key", "secret-1")])).unwrap();
        assert!(k.starts_with("hdr:x-api-key:") && !k.contains("secret"), "{k}");
        assert_eq!(k.len(), "hdr:x-api-key:".len() + 32);
        let (e, r) = key.extract(&parts("", &[])).unwrap_err();
        assert_eq!(e, ExtractError::MissingHeader(HeaderName::from_static("x-api-key")));
        assert_eq!(r, Rejection::Unauthorized);
        let (e, _) = key.extract(&parts("", &[("x-api-key", "  ")])).unwrap_err();
        assert!(matches!(e, ExtractError::InvalidHeader(_)));
        let with_fallback = Key::header("x-api-key").or(Key::peer_ip());
        assert_eq!(with_fallback.extract(&parts("192.0.2.9:1", &[])).unwrap(), "ip:192.0.2.9");
        let (e, r) = with_fallback.extract(&parts("", &[])).unwrap_err();
        assert_eq!((e, r), (ExtractError::NoPeerAddress, Rejection::BadRequest));
        let (_, r) = Key::header("x-api-key")
            .or(Key::peer_ip())
            .reject_with(Rejection::Unauthorized)
            .extract(&parts("", &[]))
            .unwrap_err();
        assert_eq!(r, Rejection::Unauthorized);
    }

    #[test]
    fn bearer_extension_global_and_closure() {
        let k = Key::bearer_token().extract(&parts("", &[("authorization", "Bearer abc")])).unwrap();
        assert!(k.starts_with("bearer:") && !k.contains("abc"));
        let (e, _) = Key::bearer_token().extract(&parts("", &[("authorization", "Basic abc")])).unwrap_err();
        assert!(matches!(e, ExtractError::InvalidHeader(_)));

        #[derive(Clone)]
        struct User(u32);
        let key = Key::extension(|u: &User| u.0.to_string());
        let mut p = parts("", &[]);
        assert!(matches!(key.extract(&p).unwrap_err().0, ExtractError::MissingIdentity(_)));
        p.extensions.insert(User(7));
        assert_eq!(key.extract(&p).unwrap(), "id:7");

        assert_eq!(Key::global().extract(&p).unwrap(), "global");
        let method = Key::from_fn(|p| Ok(p.method.to_string()));
        assert_eq!(method.extract(&p).unwrap(), "fn:GET");
    }
}
