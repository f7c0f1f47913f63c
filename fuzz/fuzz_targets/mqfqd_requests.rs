#![no_main]
libfuzzer_sys::fuzz_target!(|reqs: Vec<mqfq_daemon::fuzzing::Request>| {
    mqfq_daemon::fuzzing::mqfqd_requests(&reqs);
});
