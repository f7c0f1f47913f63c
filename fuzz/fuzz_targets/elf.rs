#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| mqfq_shim::fuzzing::elf(data));
