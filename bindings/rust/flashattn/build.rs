//! Run path for this crate's own tests and examples.
//!
//! flashattn-sys reports the directory it linked libflashattn from (`cargo:lib_dir`, seen
//! here as DEP_FLASHATTN_LIB_DIR: FLASHATTN_LIB_DIR or pkg-config's `-L`). Embedding it as
//! the run path lets `cargo test` and `cargo run --example` load that same library without
//! LD_LIBRARY_PATH. Cargo applies link arguments only to the targets of the package whose
//! build script emits them, so binaries of crates depending on flashattn get no run path
//! from here (see README.md: Linking and running).
use std::env;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FLASHATTN_LIB_DIR");
    if let Ok(dir) = env::var("DEP_FLASHATTN_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
