#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| mqfq_shim::fuzzing::interposer_reply(data));
