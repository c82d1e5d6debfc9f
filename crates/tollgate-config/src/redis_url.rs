//! Which URLs name a Redis, and what kind of deployment each scheme means: the one check of a
//! Redis URL's scheme, for `[backend] url`, `--redis` and `tollgate bench --target`. (The
//! Redis backend reads the rest of the URL; this crate does not depend on it.)

/// The kind of Redis deployment a URL's scheme names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (or a primary): `redis://`, or `rediss://` for TLS.
    Single,
    /// A Redis Cluster, by its seed nodes: `redis+cluster://`, or `rediss+cluster://` for TLS.
    Cluster,
    /// A primary found through Redis Sentinel: `redis+sentinel://`.
    Sentinel,
}

/// A URL whose scheme names no Redis deployment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{url:?} is not a Redis URL: it must start with redis://, rediss://, redis+cluster:// \
     (rediss+cluster://) for Redis Cluster, or redis+sentinel:// for Redis Sentinel"
)]
pub struct NotARedisUrl {
    /// The URL given.
    pub url: String,
}

/// Every scheme, with what it names.
const SCHEMES: [(&str, RedisTopology); 5] = [
    ("redis://", RedisTopology::Single),
    ("rediss://", RedisTopology::Single),
    ("redis+cluster://", RedisTopology::Cluster),
    ("rediss+cluster://", RedisTopology::Cluster),
    ("redis+sentinel://", RedisTopology::Sentinel),
];

impl RedisTopology {
    /// What `url`'s scheme names, or why it is not a Redis URL.
    pub fn of_url(url: &str) -> Result<RedisTopology, NotARedisUrl> {
        SCHEMES
            .iter()
            .find(|(scheme, _)| url.starts_with(scheme))
            .map(|&(_, topology)| topology)
            .ok_or_else(|| NotARedisUrl { url: url.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_their_deployment() {
        assert_eq!(RedisTopology::of_url("redis://127.0.0.1:6379"), Ok(RedisTopology::Single));
        assert_eq!(RedisTopology::of_url("rediss://a:6380/2"), Ok(RedisTopology::Single));
        assert_eq!(RedisTopology::of_url("rediss+cluster://a:1,b:2"), Ok(RedisTopology::Cluster));
        assert_eq!(RedisTopology::of_url("redis+sentinel://s:26379/m"), Ok(RedisTopology::Sentinel));
        let e = RedisTopology::of_url("http://127.0.0.1:8080").unwrap_err();
        assert!(e.to_string().starts_with("\"http://127.0.0.1:8080\" is not a Redis URL"), "{e}");
    }
}
