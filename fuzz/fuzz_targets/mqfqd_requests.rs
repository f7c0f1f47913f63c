#![no_main]
libfuzzer_sys::fuzz_target!(|reqs: Vec<mqfq_shim::fuzzing::Request>| {
    mqfq_shim::fuzzing::mqfqd_requests(&reqs);
});
