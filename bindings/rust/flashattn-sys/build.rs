//! Link flags for libflashattn.
//!
//! 1. `FLASHATTN_LIB_DIR`: a directory holding libflashattn.so (e.g. a CMake build tree);
//!    links `-lflashattn` from there.
//! 2. Otherwise the `pkg-config` binary: `pkg-config --libs flashattn` (honours
//!    PKG_CONFIG_PATH), whose `-L` and `-l` flags are passed to rustc.
//! 3. If neither works, `-lflashattn` from the linker's default paths, with a warning.
//!
//! No crates.io dependency: the pkg-config binary is run with std::process::Command.
use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FLASHATTN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    println!("cargo:rerun-if-changed=build.rs");

    if let Ok(dir) = env::var("FLASHATTN_LIB_DIR") {
        if !dir.is_empty() {
            if !Path::new(&dir).is_dir() {
                panic!("FLASHATTN_LIB_DIR={dir} is not a directory");
            }
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=dylib=flashattn");
            println!("cargo:lib_dir={dir}");
            return;
        }
    }

    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    match Command::new(&pkg_config).args(["--libs", "flashattn"]).output() {
        Ok(out) if out.status.success() => {
            let flags = String::from_utf8_lossy(&out.stdout);
            let mut linked = false;
            for flag in flags.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                    println!("cargo:lib_dir={dir}");
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={lib}");
                    linked |= lib == "flashattn";
                }
            }
            if !linked {
                println!("cargo:rustc-link-lib=dylib=flashattn");
            }
        }
        Ok(out) => {
            println!(
                "cargo:warning=`{pkg_config} --libs flashattn` failed ({}): {}; linking -lflashattn from the default \
                 paths (set FLASHATTN_LIB_DIR or PKG_CONFIG_PATH)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            println!("cargo:rustc-link-lib=dylib=flashattn");
        }
        Err(e) => {
            println!(
                "cargo:warning=could not run {pkg_config} ({e}); linking -lflashattn from the default paths (set \
                 FLASHATTN_LIB_DIR)"
            );
            println!("cargo:rustc-link-lib=dylib=flashattn");
        }
    }
}
