//! The interposer's `dlsym` beside other preloaded libraries: only CUDA lookups are answered
//! differently than without it.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::Path;
use std::process::Command;

mod common;

/// A wrapper of `puts` as tracing and sandboxing libraries write them: its `puts` finds the
/// next one with `dlsym(RTLD_NEXT, "puts")`.
const WRAP: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int puts(const char *s) {
    static int (*next)(const char *);
    if (!next) next = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    if (!next) return -1;
    fputs("wrapped: ", stdout);
    return next(s);
}
"#;

const MAIN: &str = "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n";

fn cc(dir: &Path, out: &str, src: &str, args: &[&str]) {
    let c = dir.join(format!("{out}.c"));
    std::fs::write(&c, src).unwrap();
    let o = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(dir.join(out))
        .arg(&c)
        .arg("-ldl")
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Another preloaded wrapper's `dlsym(RTLD_NEXT, "puts")` resolves as without the interposer,
/// whichever of the two is preloaded first: to the C library's `puts`. (With the interposer
/// first, it found the wrapper's own `puts` — the lookup was made from the interposer — and
/// recursed until the stack overflowed.)
#[test]
fn another_wrappers_rtld_next_lookups_resolve_as_without_the_interposer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cc(d, "libwrap.so", WRAP, &["-shared", "-fPIC"]);
    cc(d, "main", MAIN, &[]);
    let wrap = d.join("libwrap.so").display().to_string();
    let ours = common::interposer().display().to_string();
    for preload in [
        format!("{ours}:{wrap}"),
        format!("{wrap}:{ours}"),
        wrap.clone(),
    ] {
        let o = Command::new(d.join("main"))
            .env("LD_PRELOAD", &preload)
            .output()
            .unwrap();
        assert!(o.status.success(), "{preload}: {:?}", o.status);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "wrapped: hello\n",
            "{preload}"
        );
    }
}
