//! containerd finds this binary by the runtime name `io.containerd.mqfq.v2`.

use containerd_shim::Config;
use mqfq_shim::service::Service;

#[tokio::main]
async fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| a == "-v" || a == "--version")
    {
        println!("containerd-shim-mqfq-v2: {}", mqfq_shim::version());
        return;
    }
    containerd_shim::asynchronous::run::<Service>("io.containerd.mqfq.v2", Some(Config::default()))
        .await;
}
