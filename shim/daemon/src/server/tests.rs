//! The one mapping from the admission core's errors to ttrpc codes.

use super::*;

#[test]
fn every_core_error_has_one_ttrpc_code() {
    let code = |e: CoreError| match to_ttrpc(&e) {
        ttrpc::Error::RpcStatus(s) => s.code(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        code(CoreError::Invalid {
            field: "weight",
            reason: String::new()
        }),
        ttrpc::Code::INVALID_ARGUMENT
    );
    assert_eq!(
        code(CoreError::UnknownGpu("x".into())),
        ttrpc::Code::INVALID_ARGUMENT
    );
    assert_eq!(
        code(CoreError::AlreadyWaiting("ns/k".parse().unwrap())),
        ttrpc::Code::ALREADY_EXISTS
    );
    assert_eq!(code(CoreError::UnknownLease(1)), ttrpc::Code::NOT_FOUND);
    assert_eq!(
        code(CoreError::Limit {
            what: "waiting admissions",
            limit: 1
        }),
        ttrpc::Code::RESOURCE_EXHAUSTED
    );
}
