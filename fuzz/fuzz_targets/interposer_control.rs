#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| mqfq_cuda::fuzzing::control_lines(data));
