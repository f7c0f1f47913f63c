//! `mqfqd doctor`'s unit test: containerd's version read from its banner.

use super::*;

#[test]
fn containerd_versions_parse_from_its_banner() {
    assert_eq!(
        parse_version("containerd github.com/containerd/containerd v1.7.22 7f7fdf5"),
        Some((1, 7))
    );
    assert_eq!(
        parse_version("containerd containerd.io v2.1.4 75cb2b7"),
        Some((2, 1))
    );
    assert_eq!(
        parse_version("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1"),
        Some((1, 6))
    );
    assert_eq!(parse_version("containerd unknown"), None);
}
