//! A fake Kubernetes API server for `GpuNodeState` objects on 127.0.0.1: list, get, create,
//! replace with resourceVersion checks (409 on a stale one, 404 on a missing object), each
//! request recorded; failures and foreign writes can be injected.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// The server's state.
#[derive(Debug, Default)]
pub struct Store {
    /// Objects by name.
    pub objects: BTreeMap<String, Value>,
    /// Every request: "METHOD name-or-list".
    pub log: Vec<String>,
    /// Answer every request with 500 while set.
    pub down: bool,
    version: u64,
}

impl Store {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Another writer changes `name` (its resourceVersion moves on).
    pub fn foreign_write(&mut self, name: &str) {
        let v = self.next_version();
        if let Some(o) = self.objects.get_mut(name) {
            o["metadata"]["resourceVersion"] = json!(v);
        }
    }

    /// Writes (POST and PUT) recorded so far.
    pub fn writes(&self) -> usize {
        self.log
            .iter()
            .filter(|l| l.starts_with("POST") || l.starts_with("PUT"))
            .count()
    }
}

type Shared = Arc<Mutex<Store>>;

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

async fn list(Path(_ns): Path<String>, State(s): State<Shared>) -> Response {
    let mut st = s.lock().unwrap();
    st.log.push("LIST".into());
    if st.down {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "down");
    }
    let items: Vec<Value> = st.objects.values().cloned().collect();
    axum::Json(json!({
        "apiVersion": "mqfq.io/v1alpha1", "kind": "GpuNodeStateList",
        "metadata": {"resourceVersion": st.version.to_string()}, "items": items,
    }))
    .into_response()
}

async fn create(Path(_ns): Path<String>, State(s): State<Shared>, body: Bytes) -> Response {
    let mut st = s.lock().unwrap();
    let mut obj: Value = serde_json::from_slice(&body).unwrap();
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    st.log.push(format!("POST {name}"));
    if st.down {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "down");
    }
    if st.objects.contains_key(&name) {
        return status(StatusCode::CONFLICT, "AlreadyExists", "already exists");
    }
    obj["metadata"]["resourceVersion"] = json!(st.next_version());
    st.objects.insert(name, obj.clone());
    (StatusCode::CREATED, axum::Json(obj)).into_response()
}

async fn read(Path((_ns, name)): Path<(String, String)>, State(s): State<Shared>) -> Response {
    let mut st = s.lock().unwrap();
    st.log.push(format!("GET {name}"));
    if st.down {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "down");
    }
    match st.objects.get(&name) {
        Some(o) => axum::Json(o.clone()).into_response(),
        None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
    }
}

async fn replace(
    Path((_ns, name)): Path<(String, String)>,
    State(s): State<Shared>,
    body: Bytes,
) -> Response {
    let mut st = s.lock().unwrap();
    st.log.push(format!("PUT {name}"));
    if st.down {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "down");
    }
    let mut obj: Value = serde_json::from_slice(&body).unwrap();
    let Some(current) = st.objects.get(&name) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "not found");
    };
    if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified",
        );
    }
    obj["metadata"]["resourceVersion"] = json!(st.next_version());
    st.objects.insert(name, obj.clone());
    axum::Json(obj).into_response()
}

/// Serves a fake API server; its URL and its state.
pub async fn serve() -> (String, Shared) {
    let store: Shared = Arc::default();
    let base = "/apis/mqfq.io/v1alpha1/namespaces/{ns}/gpunodestates";
    let app = Router::new()
        .route(base, get(list).post(create))
        .route(&format!("{base}/{{name}}"), get(read).put(replace))
        .with_state(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, store)
}

/// A kube client for `url`.
pub fn client(url: &str) -> kube::Client {
    let cfg = kube::Config::new(url.parse().unwrap());
    kube::Client::try_from(cfg).unwrap()
}
