#!/bin/sh
# Consumer built with nothing but a compiler and pkg-config, against an *installed*
# libflashattn: build_and_run.sh <install prefix> <work dir>. CC, CXX and
# CONSUMER_FLAGS (e.g. sanitizer flags matching the library's) come from the caller.
set -eu
prefix=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
pc=$(find "$prefix" -name flashattn.pc | head -n 1)
[ -n "$pc" ] || { echo "no flashattn.pc under $prefix" >&2; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
echo "pkg-config: flashattn $(pkg-config --modversion flashattn): $(pkg-config --cflags --libs flashattn)"
libdir=$(pkg-config --variable=libdir flashattn)
mkdir -p "$work"
# shellcheck disable=SC2046,SC2086  # word splitting of the flags is intended
${CC:-cc} -std=c99 -Wall -Wextra -pedantic -Werror ${CONSUMER_FLAGS:-} \
  "$here/../common/consumer.c" -o "$work/consumer_c" $(pkg-config --cflags --libs flashattn) -lm
# shellcheck disable=SC2046,SC2086
${CXX:-c++} -std=c++17 -Wall -Wextra -pedantic -Werror ${CONSUMER_FLAGS:-} \
  "$here/../common/consumer.cpp" -o "$work/consumer_cxx" $(pkg-config --cflags --libs flashattn)
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer_c"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer_cxx"
