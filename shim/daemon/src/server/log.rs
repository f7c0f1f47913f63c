//! The dispatch log: one JSON line per queue decision, written by a thread of its own so that
//! neither the admission lock nor a ttrpc worker ever waits on the disk. Handlers hand records
//! over a channel; [`DispatchLog::flush`] waits until everything handed over is on disk (Status
//! calls it, so what `mqfqctl status` shows is already in the log).
//!
//! Bounded both ways, since containers drive what it records (every burst is an enqueue, a
//! dispatch and a release): at most [`QUEUE`] batches wait for the writer — past that a batch is
//! dropped, counted, and the writer says so with a `{"event":"dropped","records":N}` line — and
//! the file is rotated to `<path>.1` (replacing the previous one) once it passes [`MAX_BYTES`],
//! so the log takes at most twice that on disk.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use scheduler_core::node::admission::Record;

enum Msg {
    Records(Vec<Record>),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The writer's end for the daemon.
#[derive(Debug)]
pub(super) struct DispatchLog {
    tx: mpsc::SyncSender<Msg>,
    /// Records dropped since the writer last said so.
    dropped: Arc<AtomicU64>,
}

/// How long [`DispatchLog::flush`] waits for a stuck disk before answering anyway.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// Batches that may wait for the writer.
pub(super) const QUEUE: usize = 4096;
/// The size past which the file is rotated.
pub(super) const MAX_BYTES: u64 = 256 << 20;

impl DispatchLog {
    /// Opens `path` for appending (creating its directory) and starts the writer thread.
    pub(super) fn open(path: &Path) -> std::io::Result<Self> {
        Self::open_bounded(path, QUEUE, MAX_BYTES)
    }

    fn open_bounded(path: &Path, queue: usize, max_bytes: u64) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = Rotating::open(path.to_owned(), max_bytes)?;
        let (tx, rx) = mpsc::sync_channel(queue);
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("mqfqd-log".into())
            .spawn(move || write_loop(&rx, file, &counted))?;
        Ok(DispatchLog { tx, dropped })
    }

    /// Hands records to the writer (never blocks: with the writer [`QUEUE`] batches behind,
    /// they are dropped and counted).
    pub(super) fn write(&self, records: Vec<Record>) {
        let n = records.len() as u64;
        if let Err(mpsc::TrySendError::Full(_)) = self.tx.try_send(Msg::Records(records))
            && self.dropped.fetch_add(n, Ordering::SeqCst) == 0
        {
            tracing::warn!(
                "dispatch log: the writer is behind; records dropped (counted in the log)"
            );
        }
    }

    /// Waits (at most [`FLUSH_WAIT`]) until every record handed over so far is written.
    pub(super) async fn flush(&self) {
        let deadline = Instant::now() + FLUSH_WAIT;
        let (ack, done) = tokio::sync::oneshot::channel();
        let mut msg = Msg::Flush(ack);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(mpsc::TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => return,
            }
        }
        let _ = tokio::time::timeout_at(deadline.into(), done).await;
    }
}

/// The log file, rotated to `<path>.1` once it passes its size.
struct Rotating {
    path: PathBuf,
    w: std::io::BufWriter<std::fs::File>,
    written: u64,
    max_bytes: u64,
}

impl Rotating {
    fn open(path: PathBuf, max_bytes: u64) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        let written = file.metadata()?.len();
        Ok(Rotating {
            path,
            w: std::io::BufWriter::new(file),
            written,
            max_bytes,
        })
    }

    fn line(&mut self, line: &str) {
        if self.written >= self.max_bytes {
            self.rotate();
        }
        if writeln!(self.w, "{line}").is_ok() {
            self.written += line.len() as u64 + 1;
        }
    }

    fn rotate(&mut self) {
        let _ = self.w.flush();
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        let reopened = match std::fs::rename(&self.path, &old) {
            Ok(()) => Rotating::open(self.path.clone(), self.max_bytes)
                .map_err(|e| format!("cannot reopen {}: {e}", self.path.display())),
            Err(e) => Err(format!("cannot rotate {}: {e}", self.path.display())),
        };
        match reopened {
            Ok(fresh) => *self = fresh,
            Err(why) => {
                // Tried again only once as much more is written, not at every line (so this is
                // said once per try); the file grows past its bound meanwhile.
                tracing::warn!("dispatch log: {why}; writing on");
                self.written = 0;
            }
        }
    }
}

fn write_loop(rx: &mpsc::Receiver<Msg>, mut file: Rotating, dropped: &AtomicU64) {
    while let Ok(msg) = rx.recv() {
        let mut next = Some(msg);
        // Everything already queued, then one flush.
        while let Some(m) = next {
            let lost = dropped.swap(0, Ordering::SeqCst);
            if lost > 0 {
                file.line(&format!("{{\"event\":\"dropped\",\"records\":{lost}}}"));
            }
            match m {
                Msg::Records(records) => {
                    for r in &records {
                        if let Ok(line) = serde_json::to_string(r) {
                            file.line(&line);
                        }
                    }
                }
                Msg::Flush(ack) => {
                    let _ = file.w.flush();
                    let _ = ack.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = file.w.flush();
    }
}

#[cfg(test)]
mod tests {
    use scheduler_core::node::admission::Record;

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;

    use super::{DispatchLog, MAX_BYTES, Rotating, write_loop};

    fn withdraw(seq: u64) -> Record {
        Record::Withdraw {
            seq,
            t_ns: seq,
            gpu: 0,
            key: "ns/c".parse().unwrap(),
            function: "f".into(),
            reason: "test".into(),
        }
    }

    #[tokio::test]
    async fn after_a_flush_every_record_handed_over_is_on_disk_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dispatch.jsonl");
        let log = DispatchLog::open(&path).unwrap();
        for seq in 1..=200 {
            log.write(vec![withdraw(seq)]);
        }
        log.flush().await;
        let text = std::fs::read_to_string(&path).unwrap();
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
        assert!(text.contains("\"key\":\"ns/c\""), "keys written as ns/id");
    }

    #[tokio::test]
    async fn the_file_is_rotated_past_its_size_and_takes_at_most_twice_that() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dispatch.jsonl");
        let log = DispatchLog::open_bounded(&path, 64, 4096).unwrap();
        for seq in 1..=500 {
            log.write(vec![withdraw(seq)]);
            if seq % 50 == 0 {
                log.flush().await;
            }
        }
        log.flush().await;
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(dir.path().join("dispatch.jsonl.1"))
            .unwrap()
            .len();
        // One line past the size at most, in each.
        assert!(now < 4096 + 256 && old < 4096 + 256, "{now} {old}");
        let last = std::fs::read_to_string(&path).unwrap();
        assert!(
            last.lines().last().unwrap().contains("\"seq\":500"),
            "{last}"
        );
    }

    #[tokio::test]
    async fn a_writer_that_falls_behind_drops_and_says_how_many() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dispatch.jsonl");
        // A queue of one batch and, for now, no writer: the second and third batches are
        // dropped and counted.
        let (tx, rx) = mpsc::sync_channel(1);
        let log = DispatchLog {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        log.write(vec![withdraw(1)]);
        log.write(vec![withdraw(2), withdraw(3)]);
        log.write(vec![withdraw(4)]);
        assert_eq!(log.dropped.load(Ordering::SeqCst), 3);
        let counted = log.dropped.clone();
        let file = Rotating::open(path.clone(), MAX_BYTES).unwrap();
        std::thread::spawn(move || write_loop(&rx, file, &counted));
        // Once the writer has caught up, a batch is written again.
        log.flush().await;
        log.write(vec![withdraw(5)]);
        log.flush().await;
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"event": "dropped", "records": 3})
        );
        let seqs: Vec<u64> = lines[1..]
            .iter()
            .map(|v| v["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [1, 5]);
    }
}
