//! Admissions racing the container's other verbs: a delete, a second Resume, a start that
//! outlived its container or whose caller gave up.

use super::*;

/// A gate whose admissions wait for the test, recording releases.
#[derive(Debug, Default)]
struct HeldGate {
    go: tokio::sync::Notify,
    releases: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl crate::gate::Gate for HeldGate {
    async fn admit(
        &self,
        _: &str,
        _: &str,
        _: &crate::gpu::GpuWork,
        _: Kind,
        _: bool,
    ) -> Result<()> {
        self.go.notified().await;
        Ok(())
    }
    async fn cancel(&self, _: &str, _: &str) {}
    async fn release(&self, _: &str, id: &str, reason: &str, _: crate::memory::Usage) {
        self.releases
            .lock()
            .unwrap()
            .push((id.to_owned(), reason.to_owned()));
    }
}

#[tokio::test]
async fn a_delete_racing_a_granted_start_still_releases_the_lease() {
    let gate = Arc::new(HeldGate::default());
    let h = harness_with(gate.clone(), Arc::new(NoOrders));
    let gpu = gpu();
    let req = h.bundle("r1", &gpu);
    h.svc.create(req).await.unwrap();
    let svc = h.svc.clone();
    let start = tokio::spawn(async move { svc.start("r1", "").await });
    // The start waits in the queue; the container is deleted meanwhile.
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.svc.delete("r1", "").await.unwrap();
    let before = gate.releases.lock().unwrap().len();
    // Now the grant arrives: the start fails, and the lease it was given goes back.
    gate.go.notify_one();
    let r = start.await.unwrap();
    assert!(r.is_err(), "{r:?}");
    let releases = gate.releases.lock().unwrap().clone();
    assert_eq!(releases.len(), before + 1, "{releases:?}");
    assert_eq!(releases.last().unwrap().0, "r1");
}

/// A gate whose Resume admissions wait for the test (Starts pass), counting them.
#[derive(Debug, Default)]
struct ResumeGate {
    go: tokio::sync::Notify,
    resumes: std::sync::atomic::AtomicUsize,
    releases: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl crate::gate::Gate for ResumeGate {
    async fn admit(
        &self,
        _: &str,
        _: &str,
        _: &crate::gpu::GpuWork,
        kind: Kind,
        _: bool,
    ) -> Result<()> {
        if kind == Kind::Resume {
            self.resumes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.go.notified().await;
        }
        Ok(())
    }
    async fn cancel(&self, _: &str, _: &str) {}
    async fn release(&self, _: &str, _: &str, reason: &str, _: crate::memory::Usage) {
        self.releases.lock().unwrap().push(reason.to_owned());
    }
}

#[tokio::test]
async fn a_second_resume_waiting_behind_the_first_does_not_admit_or_release_again() {
    let gate = Arc::new(ResumeGate::default());
    let h = harness_with(gate.clone(), Arc::new(NoOrders));
    let gpu = gpu();
    let req = h.bundle("d1", &gpu);
    h.svc.create(req).await.unwrap();
    h.svc.start("d1", "").await.unwrap();
    h.svc.pause_task("d1").await.unwrap();
    let (a, b) = (h.svc.clone(), h.svc.clone());
    let first = tokio::spawn(async move { a.resume_task("d1").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A retried Resume arrives while the first waits in the queue.
    let second = tokio::spawn(async move { b.resume_task("d1").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.go.notify_one();
    first.await.unwrap().unwrap();
    let r = second.await.unwrap();
    assert!(matches!(r, Err(Error::FailedPrecondition(_))), "{r:?}");
    assert_eq!(gate.resumes.load(std::sync::atomic::Ordering::SeqCst), 1);
    let releases = gate.releases.lock().unwrap().clone();
    assert!(
        !releases.iter().any(|r| r == "resume failed"),
        "{releases:?}"
    );
    assert_eq!(
        h.svc.state("d1", "").await.unwrap().status(),
        api::Status::RUNNING
    );
}

#[tokio::test]
async fn a_start_that_outlived_its_container_does_not_start_the_next_one_of_that_id() {
    let gate = Arc::new(HeldGate::default());
    let h = harness_with(gate.clone(), Arc::new(NoOrders));
    let gpu = gpu();
    let req = h.bundle("r1", &gpu);
    h.svc.create(req.clone()).await.unwrap();
    let svc = h.svc.clone();
    let start = tokio::spawn(async move { svc.start("r1", "").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Deleted while its start waits in the queue, and made again under the same id.
    h.svc.delete("r1", "").await.unwrap();
    h.svc.create(req).await.unwrap();
    gate.go.notify_one();
    start.await.unwrap().unwrap_err();
    assert_eq!(
        h.svc.state("r1", "").await.unwrap().status(),
        api::Status::CREATED,
        "the new container was never started"
    );
    let releases = gate.releases.lock().unwrap().clone();
    assert_eq!(
        releases.last().map(|r| r.0.as_str()),
        Some("r1"),
        "{releases:?}"
    );
}

#[tokio::test]
async fn a_start_whose_caller_gave_up_is_carried_to_the_end() {
    // ttrpc drops a handler past the caller's deadline; the start goes on regardless.
    let gate = Arc::new(HeldGate::default());
    let mut h = harness_with(gate.clone(), Arc::new(NoOrders));
    let gpu = gpu();
    h.svc.create(h.bundle("g1", &gpu)).await.unwrap();
    let req = api::StartRequest {
        id: "g1".into(),
        ..Default::default()
    };
    let c = ctx();
    let dropped = tokio::time::timeout(Duration::from_millis(50), Task::start(&h.svc, &c, req));
    assert!(dropped.await.is_err(), "still waiting for admission");
    gate.go.notify_one();
    assert_eq!(h.next_topic().await, "create");
    assert_eq!(
        h.next_topic().await,
        "start",
        "started, though nobody waits for it"
    );
    assert_eq!(
        h.svc.state("g1", "").await.unwrap().status(),
        api::Status::RUNNING
    );
}
