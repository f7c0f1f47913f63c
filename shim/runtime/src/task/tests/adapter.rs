//! The ttrpc adapters: each error mapped to its code, each call reaching the runtime.

use super::*;

fn code(e: ttrpc::Error) -> ttrpc::Code {
    match e {
        ttrpc::Error::RpcStatus(s) => s.code(),
        other => panic!("not a status: {other:?}"),
    }
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "each ttrpc adapter called in turn on one harness"
)]
async fn ttrpc_adapters_map_codes_and_reach_the_runtime() {
    let h = harness();
    let svc: &dyn Task = &h.svc;
    let e = svc
        .checkpoint(&ctx(), api::CheckpointTaskRequest::default())
        .await
        .unwrap_err();
    assert_eq!(code(e), ttrpc::Code::UNIMPLEMENTED);
    let e = svc
        .state(
            &ctx(),
            api::StateRequest {
                id: "ghost".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), ttrpc::Code::NOT_FOUND);
    let req = h.bundle("u1", &plain());
    let created = svc.create(&ctx(), req.clone()).await.unwrap();
    let e = svc.create(&ctx(), req).await.unwrap_err();
    assert_eq!(code(e), ttrpc::Code::ALREADY_EXISTS);
    let resources = json!({"memory": {"limit": 67_108_864}, "cpu": {"shares": 512}});
    svc.update(
        &ctx(),
        api::UpdateTaskRequest {
            id: "u1".into(),
            resources: MessageField::some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
                value: resources.to_string().into_bytes(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(h.fake.calls().contains(&"update u1".to_owned()));
    let e = svc
        .update(
            &ctx(),
            api::UpdateTaskRequest {
                id: "u1".into(),
                resources: MessageField::some(Any {
                    value: b"{not json".to_vec(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), ttrpc::Code::INVALID_ARGUMENT);
    svc.close_io(
        &ctx(),
        api::CloseIORequest {
            id: "u1".into(),
            stdin: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    svc.resize_pty(
        &ctx(),
        api::ResizePtyRequest {
            id: "u1".into(),
            width: 80,
            height: 24,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = svc
        .connect(
            &ctx(),
            api::ConnectRequest {
                id: "u1".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((c.shim_pid, c.task_pid), (std::process::id(), created.pid));
    let pids = svc
        .pids(
            &ctx(),
            api::PidsRequest {
                id: "u1".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(pids.processes.len(), 1);
    // Shutdown with a container left does nothing; `now` forces it.
    svc.shutdown(&ctx(), api::ShutdownRequest::default())
        .await
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(100), h.exit.wait()).await;
    assert!(waited.is_err(), "shut down with a container still there");
    svc.shutdown(
        &ctx(),
        api::ShutdownRequest {
            now: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(1), h.exit.wait())
        .await
        .unwrap();
}
