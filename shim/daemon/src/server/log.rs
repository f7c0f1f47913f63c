//! The dispatch log: one JSON line per queue decision, written by a thread of its own so that
//! neither the admission lock nor a ttrpc worker ever waits on the disk. Handlers hand records
//! over a channel; [`DispatchLog::flush`] waits until everything handed over is on disk (Status
//! calls it, so what `mqfqctl status` shows is already in the log).

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use scheduler_core::node::admission::Record;

enum Msg {
    Records(Vec<Record>),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The writer's end for the daemon.
#[derive(Debug)]
pub(super) struct DispatchLog {
    tx: mpsc::Sender<Msg>,
}

/// How long [`DispatchLog::flush`] waits for a stuck disk before answering anyway.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

impl DispatchLog {
    /// Opens `path` for appending (creating its directory) and starts the writer thread.
    pub(super) fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("mqfqd-log".into())
            .spawn(move || write_loop(&rx, std::io::BufWriter::new(file)))?;
        Ok(DispatchLog { tx })
    }

    /// Hands records to the writer (never blocks).
    pub(super) fn write(&self, records: Vec<Record>) {
        let _ = self.tx.send(Msg::Records(records));
    }

    /// Waits (at most [`FLUSH_WAIT`]) until every record handed over so far is written.
    pub(super) async fn flush(&self) {
        let (ack, done) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Flush(ack)).is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, done).await;
        }
    }
}

fn write_loop(rx: &mpsc::Receiver<Msg>, mut w: std::io::BufWriter<std::fs::File>) {
    while let Ok(msg) = rx.recv() {
        let mut next = Some(msg);
        // Everything already queued, then one flush.
        while let Some(m) = next {
            match m {
                Msg::Records(records) => {
                    for r in &records {
                        if let Ok(line) = serde_json::to_string(r) {
                            let _ = writeln!(w, "{line}");
                        }
                    }
                }
                Msg::Flush(ack) => {
                    let _ = w.flush();
                    let _ = ack.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = w.flush();
    }
}

#[cfg(test)]
mod tests {
    use scheduler_core::node::admission::Record;

    use super::DispatchLog;

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
}
