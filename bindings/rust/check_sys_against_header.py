#!/usr/bin/env python3
"""Check the hand-written flashattn-sys declarations against include/flashattn.h.

Parses both files as text (the header with bindings/header_api.py; no compiler needed)
and fails on: a header function missing from the `extern "C"` block (or an extra one), a
different argument count, an argument or return type that is not the header's C type
(pointer constness included: `const T*` is `*const T`, `T*` is `*mut T`), an enum constant
or numeric #define that is missing or has another value, or an args struct whose fields
differ in name, order or type.

Usage: check_sys_against_header.py [--header H] [--sys flashattn-sys/src/lib.rs] [--self-test]
--self-test also proves the check catches deliberately broken copies.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import header_api  # noqa: E402
DEFAULT_HEADER = os.path.join(REPO, "include", "flashattn.h")
DEFAULT_SYS = os.path.join(HERE, "flashattn-sys", "src", "lib.rs")

C_TO_RUST = {"void": "c_void", "int": "i32", "char": "i8", "float": "f32", "double": "f64", "int64_t": "i64",
             "uint64_t": "u64", "int32_t": "i32", "uint32_t": "u32", "uint8_t": "u8", "int8_t": "i8",
             "uint16_t": "u16", "int16_t": "i16", "size_t": "usize"}
RUST_EQUIV = {"c_int": "i32", "c_uint": "u32", "c_float": "f32", "c_double": "f64", "c_char": "i8",
              "c_longlong": "i64", "c_ulonglong": "u64"}


def rust_type(ct):
    """Rust type of a header_api.CType (None for void): const qualifies the innermost pointee."""
    if ct.spelled == "void":
        return None
    base = ct.base[len("struct "):] if ct.base.startswith("struct ") else C_TO_RUST.get(ct.base, ct.base)
    t = base
    for level in range(ct.stars):
        t = ("*const " if ct.const and level == 0 else "*mut ") + t
    return t


def parse_header(text):
    """The header's functions, enum constants, #defines and structs with Rust types."""
    api = header_api.parse_header(text)
    return {"functions": {name: (rust_type(ret), [rust_type(p) for p in params])
                          for name, (ret, params) in api["functions"].items()},
            "enums": api["enums"], "defines": api["defines"],
            "structs": {name: [(f, rust_type(t)) for f, t in fields] for name, fields in api["structs"].items()}}


def parse_rust(text):
    text = re.sub(r"//[^\n]*", "", text)
    out = {"functions": {}, "consts": {}, "aliases": {}, "structs": {}}
    for m in re.finditer(r"pub\s+type\s+(\w+)\s*=\s*([^;]+);", text):
        out["aliases"][m.group(1)] = " ".join(m.group(2).split())
    raw_consts = {m.group(1): m.group(2) for m in re.finditer(r"pub\s+const\s+(\w+)\s*:\s*[^=]+=\s*([^;]+);", text)}
    for _ in range(3):
        for k, v in raw_consts.items():
            if k not in out["consts"]:
                try:
                    out["consts"][k] = header_api.eval_int(v, out["consts"])
                except ValueError:
                    pass
    for blk in re.finditer(r'extern\s+"C"\s*\{(.*?)\n\}', text, flags=re.S):
        for m in re.finditer(r"pub\s+fn\s+(\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+?))?\s*;", blk.group(1), flags=re.S):
            args = [a.split(":", 1)[1].strip() if ":" in a else None
                    for a in header_api.split_top(" ".join(m.group(2).split()))]
            out["functions"][m.group(1)] = (" ".join(m.group(3).split()) if m.group(3) else None, args)
    for m in re.finditer(r"pub\s+struct\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        fields = [(f.group(1), " ".join(f.group(2).split()))
                  for f in re.finditer(r"pub\s+(\w+)\s*:\s*([^,]+),", m.group(2))]
        out["structs"][m.group(1)] = fields
    return out


def canon(t, aliases):
    if t is None:
        return None
    t = re.sub(r"\b(?:core|std)::(?:ffi|os::raw)::", "", t)
    for _ in range(5):
        new = re.sub(r"\b(\w+)\b", lambda m: aliases.get(m.group(1), m.group(1)), t)
        if new == t:
            break
        t = new
    t = re.sub(r"\b(\w+)\b", lambda m: RUST_EQUIV.get(m.group(1), m.group(1)), t)
    return " ".join(t.split())


def compare(hdr, rs):
    problems = []
    al = rs["aliases"]
    hal = dict(al)  # the header's typedef/enum names resolve through the crate's aliases
    for name, (ret, params) in sorted(hdr["functions"].items()):
        if name not in rs["functions"]:
            problems.append("function %s: missing from the extern block" % name)
            continue
        rret, rargs = rs["functions"][name]
        if len(rargs) != len(params):
            problems.append("%s: %d arguments, the header has %d" % (name, len(rargs), len(params)))
            continue
        for i, (ct, rt) in enumerate(zip(params, rargs)):
            if canon(ct, hal) != canon(rt, al):
                problems.append("%s: argument %d is %s, the header's type is %s" % (name, i + 1, rt, ct))
        if canon(ret, hal) != canon(rret, al):
            problems.append("%s: returns %s, the header returns %s" % (name, rret, ret))
    for name in sorted(set(rs["functions"]) - set(hdr["functions"])):
        problems.append("extern fn %s: not a function of the header" % name)
    for name, val in sorted({**hdr["enums"], **hdr["defines"]}.items()):
        if name not in rs["consts"]:
            problems.append("constant %s = %d: missing" % (name, val))
        elif rs["consts"][name] != val:
            problems.append("constant %s: %r, the header has %d" % (name, rs["consts"][name], val))
    for name, fields in sorted(hdr["structs"].items()):
        rf = rs["structs"].get(name)
        if rf is None:
            problems.append("struct %s: missing" % name)
        elif [f for f, _ in rf] != [f for f, _ in fields]:
            problems.append("struct %s: fields %s, the header has %s" % (name, [f for f, _ in rf], [f for f, _ in fields]))
        else:
            for (f, ct), (_, rt) in zip(fields, rf):
                if canon(ct, hal) != canon(rt, al):
                    problems.append("struct %s field %s: %s, the header's type is %s" % (name, f, rt, ct))
    return problems


MUTATIONS = [
    ("argument constness", "rs", "strides: *const i64,\n    ) -> flashattn_status_t;\n    pub fn flashattn_plan_set_softmax_scale",
     "strides: *mut i64,\n    ) -> flashattn_status_t;\n    pub fn flashattn_plan_set_softmax_scale", "flashattn_plan_set_strides"),
    ("argument type", "rs", "seed: u64, offset: u64", "seed: u32, offset: u64", "flashattn_plan_set_dropout"),
    ("function missing", "rs", "    pub fn flashattn_has_cuda_backend() -> c_int;\n", "", "flashattn_has_cuda_backend"),
    ("enum value", "rs", "FLASHATTN_STATUS_INVALID_SEQLENS: flashattn_status_t = 112", "FLASHATTN_STATUS_INVALID_SEQLENS: flashattn_status_t = 111",
     "FLASHATTN_STATUS_INVALID_SEQLENS"),
    ("struct field order", "rs", "    pub dq: *mut c_void,\n    pub dk: *mut c_void,\n", "    pub dk: *mut c_void,\n    pub dq: *mut c_void,\n",
     "flashattn_bwd_args_t"),
    ("header gains a function", "h", "FLASHATTN_API int flashattn_has_cuda_backend(void);",
     "FLASHATTN_API int flashattn_has_cuda_backend(void);\nFLASHATTN_API int flashattn_extra(const float* x);",
     "flashattn_extra"),
    ("header field type", "h", "  const int32_t* cu_seqlens_k;  /**< int32 [batch+1] token offsets. Required iff varlen. */",
     "  const int64_t* cu_seqlens_k;", "cu_seqlens_k"),
]


def self_test(header, rs):
    results = [("real files pass", compare(parse_header(header), parse_rust(rs)))]
    failed = 0 if not results[0][1] else 1
    print("%s real files pass" % ("PASS" if not results[0][1] else "FAIL"))
    for desc, which, old, new, word in MUTATIONS:
        src = rs if which == "rs" else header
        if old not in src:
            print("FAIL detects: %s (anchor not found)" % desc)
            failed += 1
            continue
        broken = src.replace(old, new, 1)
        probs = compare(parse_header(broken if which == "h" else header), parse_rust(broken if which == "rs" else rs))
        ok = any(word in p for p in probs)
        failed += not ok
        print("%s detects: %s" % ("PASS" if ok else "FAIL", desc))
    total = 1 + len(MUTATIONS)
    print("%d passed, %d failed" % (total - failed, failed))
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--header", default=DEFAULT_HEADER)
    ap.add_argument("--sys", default=DEFAULT_SYS)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    with open(a.header) as f:
        header = f.read()
    with open(a.sys) as f:
        rs = f.read()
    if a.self_test:
        return self_test(header, rs)
    hdr = parse_header(header)
    problems = compare(hdr, parse_rust(rs))
    if problems:
        print("FAIL: %s does not match %s:" % (a.sys, a.header))
        for p in problems:
            print("  - " + p)
        return 1
    print("OK: flashattn-sys matches the header (%d functions, %d constants, %d structs)"
          % (len(hdr["functions"]), len(hdr["enums"]) + len(hdr["defines"]), len(hdr["structs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
