//! The crates' SPDX license expression names the repository's license.

#[test]
fn license_metadata_matches_the_license_file() {
    let license = include_str!("../../../../LICENSE");
    assert_eq!(license.lines().next(), Some("BSD 3-Clause License"));
    assert_eq!(env!("CARGO_PKG_LICENSE"), "BSD-3-Clause");
    // flashattn-sys takes the same workspace value.
    let sys = include_str!("../../flashattn-sys/Cargo.toml");
    assert!(sys.lines().any(|l| l.trim() == "license.workspace = true"), "flashattn-sys: no license.workspace");
    assert!(!sys.lines().any(|l| l.trim_start().starts_with("license =")), "flashattn-sys: its own license");
}
