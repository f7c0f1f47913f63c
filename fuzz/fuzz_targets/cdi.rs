#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| mqfq_daemon::fuzzing::cdi(data));
