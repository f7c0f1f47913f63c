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

/// The same wrapper resolving in its constructor, which the loader may run before the
/// interposer's own.
const WRAP_AT_LOAD: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
static int (*next)(const char *);
__attribute__((constructor)) static void find(void) {
    next = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
}
int puts(const char *s) {
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
/// whichever of the two is preloaded first, when it is called or in the wrapper's constructor
/// (which may run before the interposer's): to the C library's `puts`. (With the interposer
/// first, it found the wrapper's own `puts` — the lookup was made from the interposer — and
/// recursed until the stack overflowed.)
#[test]
fn another_wrappers_rtld_next_lookups_resolve_as_without_the_interposer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cc(d, "libwrap.so", WRAP, &["-shared", "-fPIC"]);
    cc(d, "libwrapload.so", WRAP_AT_LOAD, &["-shared", "-fPIC"]);
    cc(d, "main", MAIN, &[]);
    let ours = common::interposer().display().to_string();
    let mut orders = Vec::new();
    for lib in ["libwrap.so", "libwrapload.so"] {
        let wrap = d.join(lib).display().to_string();
        orders.extend([format!("{ours}:{wrap}"), format!("{wrap}:{ours}"), wrap]);
    }
    for preload in orders {
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

/// Both stream variants of `cuLaunchKernel`, looked up through `cuGetProcAddress_v2` (legacy
/// flag, per-thread flag) in either order, and the per-thread one by name; each call is reported
/// by the libcuda double as the variant it reached, and which library each pointer lives in.
const VARIANTS: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static const char *lib_of(void *p) {
    Dl_info i;
    const char *n = dladdr(p, &i) && i.dli_fname ? strrchr(i.dli_fname, '/') : NULL;
    return n ? n + 1 : "?";
}
int main(int argc, char **argv) {
    int ptds_first = argc > 1 && strcmp(argv[1], "ptds-first") == 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    void *legacy = NULL, *ptsz = NULL;
    int st;
    if (ptds_first) {
        gpa("cuLaunchKernel", &ptsz, 12000, 2, &st);
        gpa("cuLaunchKernel", &legacy, 12000, 1, &st);
    } else {
        gpa("cuLaunchKernel", &legacy, 12000, 1, &st);
        gpa("cuLaunchKernel", &ptsz, 12000, 2, &st);
    }
    void *named = dlsym(h, "cuLaunchKernel_ptsz");
    if (!legacy || !ptsz || !named) return 3;
    printf("%s %s %s\n", lib_of(legacy), lib_of(ptsz), lib_of(named));
    ((launch_fn)ptsz)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    ((launch_fn)legacy)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    ((launch_fn)named)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    return 0;
}
"#;

/// `cuGetProcAddress` keeps each stream variant apart: a per-thread default stream lookup
/// reaches `cuLaunchKernel_ptsz`, a legacy one `cuLaunchKernel`, whichever was looked up first,
/// and both through the interposer's wrappers (gated); so does `dlsym` of the `_ptsz` name.
/// (Both had collapsed to the first one looked up, and the `_ptsz` name was not wrapped.)
#[test]
fn each_stream_variant_keeps_its_own_wrapper_and_driver_function() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    if common::built(d, &["cuda"]).is_none() {
        return;
    }
    cc(d, "variants", VARIANTS, &[]);
    for order in ["legacy-first", "ptds-first"] {
        let log = d.join(format!("{order}.log"));
        let o = Command::new(d.join("variants"))
            .arg(order)
            .env("LD_PRELOAD", common::interposer())
            .env("LD_LIBRARY_PATH", d)
            .env("FAKE_CUDA_LOG", &log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{order}: {o:?}");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "libmqfq_cuda.so libmqfq_cuda.so libmqfq_cuda.so\n",
            "{order}: each pointer is the interposer's wrapper"
        );
        let launches: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("launch"))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            launches,
            ["launch ptsz", "launch", "launch ptsz"],
            "{order}"
        );
    }
}
