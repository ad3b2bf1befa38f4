//! Measures the device: `cargo run --release --example device_probe -- BLOCK_KIB DEPTH THREADS FILE...`
//! (each thread reads its share of the files with its own ring).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let block: usize = args[0].parse::<usize>().unwrap() << 10;
    let depth: usize = args[1].parse().unwrap();
    let threads: usize = args[2].parse().unwrap();
    let files: Vec<std::path::PathBuf> = args[3..].iter().map(Into::into).collect();
    let start = std::time::Instant::now();
    let bytes: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<&std::path::Path> = files
                    .iter()
                    .skip(t)
                    .step_by(threads)
                    .map(std::path::PathBuf::as_path)
                    .collect();
                s.spawn(move || {
                    foliocache::io::probe::sequential_read(&mine, block, depth)
                        .unwrap()
                        .bytes
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let secs = start.elapsed().as_secs_f64();
    println!("{:.0} MiB/s", bytes as f64 / secs / f64::from(1 << 20));
}
