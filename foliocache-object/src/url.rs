//! `s3://bucket/key` names, and the S3 client for a bucket (one per bucket and process, so
//! the files of a bucket share its connections and its bound on GETs in flight).

use crate::Error;
use crate::backend::{ObjectOptions, StoreLink};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, RetryConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// An object's name: `s3://bucket/key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    /// The bucket.
    pub bucket: String,
    /// The key (no leading slash).
    pub key: String,
}

impl ObjectUrl {
    /// Parses `s3://bucket/key`.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("only s3://bucket/key is understood"))?;
        let (bucket, key) = rest
            .split_once('/')
            .ok_or_else(|| bad("no key after the bucket"))?;
        if bucket.is_empty() {
            return Err(bad("the bucket is empty"));
        }
        if key.is_empty() || key.ends_with('/') {
            return Err(bad("the key is empty or names a directory"));
        }
        Path::parse(key).map_err(|error| bad(&error.to_string()))?;
        Ok(Self {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    /// Whether `name` looks like an object URL (`s3://`).
    pub fn is_object_url(name: &str) -> bool {
        name.starts_with("s3://")
    }

    /// The key as an `object_store` path.
    pub fn path(&self) -> Path {
        Path::from(self.key.as_str())
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Whether the environment names credentials of any kind `object_store` reads.
fn credentials_in_environment() -> bool {
    [
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some())
}

/// The S3 client for `bucket`, built once per process (and set of options) from the environment, as
/// `object_store` reads it (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`, ...), with the retries and timeouts of
/// `options`. With an endpoint set (a store other than AWS) and no credentials in the
/// environment, requests go unsigned (a local store, a public bucket).
pub(crate) fn link_for(bucket: &str, options: &ObjectOptions) -> Result<Arc<StoreLink>, Error> {
    static LINKS: OnceLock<Mutex<HashMap<String, Arc<StoreLink>>>> = OnceLock::new();
    let links = LINKS.get_or_init(Mutex::default);
    let mut links = links.lock().unwrap_or_else(PoisonError::into_inner);
    // One client per bucket and set of options.
    let name = format!("{bucket}\0{options:?}");
    if let Some(link) = links.get(&name) {
        return Ok(Arc::clone(link));
    }
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(RetryConfig {
            max_retries: options.store_retries,
            retry_timeout: options.deadline,
            ..RetryConfig::default()
        })
        .with_client_options(
            ClientOptions::new()
                .with_timeout(options.request_timeout)
                .with_connect_timeout(
                    options
                        .request_timeout
                        .min(std::time::Duration::from_secs(5)),
                )
                .with_allow_http(
                    std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true" || v == "1"),
                ),
        );
    let endpoint =
        std::env::var_os("AWS_ENDPOINT").or_else(|| std::env::var_os("AWS_ENDPOINT_URL"));
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint.to_string_lossy());
        if !credentials_in_environment() {
            builder = builder.with_skip_signature(true);
        }
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
    }
    let store = builder.build().map_err(|error| Error::Store {
        what: format!("the S3 client for bucket {bucket}"),
        source: error,
    })?;
    let link = StoreLink::new(Arc::new(store), options.clone());
    links.insert(name, Arc::clone(&link));
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let url = ObjectUrl::parse("s3://b/dir/k.parquet").unwrap();
        assert_eq!(url.bucket, "b");
        assert_eq!(url.key, "dir/k.parquet");
        assert_eq!(url.to_string(), "s3://b/dir/k.parquet");
        for bad in [
            "b/k",
            "s3://b",
            "s3:///k",
            "s3://b/",
            "s3://b/dir/",
            "http://b/k",
        ] {
            assert!(ObjectUrl::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
