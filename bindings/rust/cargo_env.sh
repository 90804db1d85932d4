# shellcheck shell=sh
# Sourced (POSIX sh) by run_tests.sh and run_prefix_example.sh: finds cargo and picks where
# the crates.io dependencies (only `half`, for the feature of that name) come from, offline.
# Defines run_cargo ARGS..., or prints a skip line and exits 77 (CTest SKIP_RETURN_CODE)
# when there is no cargo.
#   - Debian's librust-half-dev installs the crate under /usr/share/cargo/registry: when it
#     holds half, crates.io is replaced by that directory (same checksums as crates.io).
#   - Otherwise cargo's own cache must hold it (`cargo fetch` once while online).
cargo=$(command -v cargo 2>/dev/null || true)
if [ -z "$cargo" ] && [ -x "${CARGO_HOME:-${HOME:-/nonexistent}/.cargo}/bin/cargo" ]; then
  cargo="${CARGO_HOME:-$HOME/.cargo}/bin/cargo"
fi
if [ -z "$cargo" ]; then
  echo "SKIPPED: cargo not found (the Rust binding's tests need a Rust toolchain)"
  exit 77
fi
debian_registry=/usr/share/cargo/registry
if ls -d "$debian_registry"/half-* >/dev/null 2>&1; then
  crates_from="the Debian packages in $debian_registry"
  run_cargo() {
    "$cargo" --config 'source.crates-io.replace-with="debian-packages"' \
      --config "source.debian-packages.directory=\"$debian_registry\"" "$@"
  }
else
  crates_from="cargo's cache (no half crate in $debian_registry: install librust-half-dev, or run cargo fetch online)"
  run_cargo() { "$cargo" "$@"; }
fi
echo "rust binding: $("$cargo" --version), $("${cargo%cargo}rustc" --version 2>/dev/null || rustc --version); crates.io crates from $crates_from"
