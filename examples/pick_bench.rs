//! Measures how long `Scheduler::pick` takes, for each algorithm (with equal
//! weights and with weights 1..5), with 1, 10 and 50 backends, on 1, 2 and 4
//! threads picking at once.
//!
//! ```text
//! cargo run --release --example pick_bench
//! ```
//!
//! A benchmark, not a test: the numbers depend on the machine and on what
//! else runs on it. Each cell is the CPU time of one pick in one thread (the
//! thread's CPU time / its picks, averaged over threads): time spent waiting
//! for a core while other programs run is not counted, but time lost to
//! contention (cache lines moving between cores) is. Each cell runs
//! `TRIALS` times after a warm-up and keeps the best trial; the load average
//! is printed so a reader can judge how quiet the machine was.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rodizio::backend::Backend;
use rodizio::scheduler::{Algorithm, Scheduler};

/// Each cell is measured in `TRIALS` runs of `TRIAL`; the best is kept.
const TRIAL: Duration = Duration::from_millis(60);
const TRIALS: usize = 7;
/// Picks between two looks at the clock.
const BATCH: u32 = 1024;

fn main() {
    // (label, algorithm, whether the backends get weights 1..=5)
    let rows = [
        ("round-robin", Algorithm::RoundRobin, false),
        (
            "weighted-round-robin (weights 1..5)",
            Algorithm::WeightedRoundRobin,
            true,
        ),
        ("least-connections", Algorithm::LeastConnections, false),
        (
            "least-connections (weights 1..5)",
            Algorithm::LeastConnections,
            true,
        ),
        ("ip-hash", Algorithm::IpHash, false),
        ("ip-hash (weights 1..5)", Algorithm::IpHash, true),
    ];
    let sizes = [1usize, 10, 50];
    let threads = [1usize, 2, 4];
    println!(
        "cores: {}",
        thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average: {}", load.trim());
    }
    println!();
    print!("| algorithm | backends |");
    for t in threads {
        print!(
            " {t} thread{} (ns CPU/pick) |",
            if t == 1 { "" } else { "s" }
        );
    }
    println!();
    print!("|---|---:|");
    for _ in threads {
        print!("---:|");
    }
    println!();
    for (label, algorithm, weighted) in rows {
        for n in sizes {
            print!("| {label} | {n} |");
            for t in threads {
                print!(" {:.0} |", measure(algorithm, weighted, n, t));
            }
            println!();
        }
    }
}

/// CPU time used by the calling thread so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Mean CPU nanoseconds per pick for one thread among `threads`.
fn measure(algorithm: Algorithm, weighted: bool, n: usize, threads: usize) -> f64 {
    let backends: Vec<Arc<Backend>> = (0..n)
        .map(|i| {
            let weight = if weighted { (i % 5 + 1) as u32 } else { 1 };
            Arc::new(Backend::new(format!("10.0.0.{i}:80"), vec![], weight))
        })
        .collect();
    // Uneven open connections, for least-connections to compare.
    for (i, b) in backends.iter().enumerate() {
        for _ in 0..(i * 7 % 5) {
            std::mem::forget(b.start_connection());
        }
    }
    let scheduler = Arc::new(Scheduler::with_algorithm(backends, algorithm));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let scheduler = Arc::clone(&scheduler);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                // Many client addresses, for ip-hash.
                let peers: Vec<IpAddr> = (0..4096u32)
                    .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i + (t as u32) * 4096)))
                    .collect();
                let run = |time: Duration| {
                    let started = Instant::now();
                    let cpu_started = thread_cpu_ns();
                    let mut picks = 0u64;
                    let mut k = 0usize;
                    while started.elapsed() < time {
                        for _ in 0..BATCH {
                            let pick = scheduler.pick(peers[k & 4095]);
                            black_box(pick);
                            k += 1;
                        }
                        picks += u64::from(BATCH);
                    }
                    (thread_cpu_ns() - cpu_started) as f64 / picks as f64
                };
                barrier.wait();
                run(TRIAL); // warm-up
                (0..TRIALS)
                    .map(|_| {
                        barrier.wait();
                        run(TRIAL)
                    })
                    .collect::<Vec<f64>>()
            })
        })
        .collect();
    let per_thread: Vec<Vec<f64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // The mean over threads of each trial; the best trial is the one the
    // rest of the machine disturbed least.
    (0..TRIALS)
        .map(|trial| per_thread.iter().map(|t| t[trial]).sum::<f64>() / threads as f64)
        .fold(f64::INFINITY, f64::min)
}
