//! The per-process control socket: `$MQFQ_CTL_DIR/cuda-<pid>.sock`, a line protocol for `mqfqd`.
//!
//! ```text
//! → hello <container id>     (must match MQFQ_CONTAINER_ID when the shim set it)
//! ← ok
//! → status                   ← ok managed=<bytes> resident=<bytes> native=<bytes> evicted=<0|1>
//!                                 vmm=<bytes> async=<bytes> array=<bytes> setting=<bytes>
//!                                 library=<bytes> export=<bytes> refused=<count>   (one line)
//! → evict                    ← ok evicted=<bytes>
//! → prefetch                 ← ok prefetched=<bytes>
//! anything else              ← error <why>            (logged; the connection stays usable)
//! ```
//! Lines are at most 256 bytes; a longer one ends the connection. Nothing here can take the
//! application down: every failure is an answer or a log line.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

const MAX_LINE: u64 = 256;

/// Binds the socket and starts the control thread.
///
/// # Errors
/// The directory or socket cannot be made.
pub fn start(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(format!("cuda-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let expected = std::env::var("MQFQ_CONTAINER_ID").ok();
    std::thread::Builder::new()
        .name("mqfq-cuda-ctl".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        // One thread per connection: a client that stays connected (mqfqd) must
                        // not lock others out.
                        let expected = expected.clone();
                        let spawned = std::thread::Builder::new()
                            .name("mqfq-cuda-conn".into())
                            .spawn(move || serve(c, expected.as_deref()));
                        if let Err(e) = spawned {
                            log!("control connection: {e}");
                        }
                    }
                    Err(e) => log!("accept: {e}"),
                }
            }
        })?;
    Ok(())
}

fn serve(conn: UnixStream, expected: Option<&str>) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(conn.take(u64::MAX));
    let mut greeted = false;
    loop {
        let mut line = String::new();
        match (&mut lines).take(MAX_LINE + 1).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') {
            log!("control: truncated or overlong message; connection closed");
            let _ = writeln!(out, "error truncated or overlong message");
            return;
        }
        let reply = answer(line.trim_end(), &mut greeted, expected);
        if reply.starts_with("error") {
            log!("control: {:?}: {reply}", line.trim_end());
        }
        if writeln!(out, "{reply}").is_err() {
            return;
        }
        if reply.starts_with("error wrong container") {
            return;
        }
    }
}

pub(crate) fn answer(line: &str, greeted: &mut bool, expected: Option<&str>) -> String {
    let mut words = line.split_whitespace();
    let cmd = words.next().unwrap_or("");
    if !*greeted {
        return match (cmd, words.next()) {
            ("hello", Some(id)) if expected.is_none_or(|e| e == id) => {
                *greeted = true;
                "ok".into()
            }
            ("hello", Some(id)) => format!("error wrong container {id}"),
            _ => "error say hello <container id> first".into(),
        };
    }
    match cmd {
        "status" => {
            let (managed, resident, evicted) = crate::state::status();
            let k = crate::state::kept();
            format!(
                "ok managed={managed} resident={resident} native={} evicted={} vmm={} async={} \
                 array={} setting={} library={} export={} refused={}",
                k.alloc_native(),
                u8::from(evicted),
                k.vmm,
                k.stream_ordered,
                k.array,
                k.setting,
                k.library,
                k.export,
                k.refused
            )
        }
        "evict" => match crate::state::evict() {
            Ok(b) => format!("ok evicted={b}"),
            Err(e) => format!("error evict: {e}"),
        },
        "prefetch" => match crate::state::prefetch() {
            Ok(b) => format!("ok prefetched={b}"),
            Err(e) => format!("error prefetch: {e}"),
        },
        "" => "error empty message".into(),
        other => format!("error unknown command {other:?}"),
    }
}
