#!/usr/bin/env python3
"""Check the Julia wrapper (FlashAttn.jl) against the C header (flashattn.h).

No Julia runtime is needed: both files are parsed as text.

From the header (parsed by bindings/header_api.py): every FLASHATTN_API function (return
type, parameter C types), every enum constant and its value, the numeric #defines, and the
fields of every `typedef struct ... { } name;`.
From the Julia file: every `@ccall libflashattn.NAME(arg::Type, ...)::Ret` site, every
`const NAME = value` (with `const alias = Type` type aliases), every `struct NAME ... end`.

Fails (exit 1, listing every problem) when:
  * a header function has no @ccall site, or a @ccall names a function not in the header;
  * a @ccall's argument count, an argument's type or the return type does not map to the
    header's C type;
  * an enum constant or numeric #define is missing or has another value;
  * a struct is missing, or its fields differ in name, order or type.

Usage: check_against_header.py [--header include/flashattn.h] [--julia bindings/julia/src/FlashAttn.jl]
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from header_api import CType, eval_int, parse_header, split_top  # noqa: E402

# C scalar type -> Julia type.
C_SCALARS = {
    "void": "Cvoid", "int": "Cint", "unsigned int": "Cuint", "float": "Cfloat", "double": "Cdouble",
    "size_t": "Csize_t", "char": "Cchar", "int64_t": "Int64", "uint64_t": "UInt64", "int32_t": "Int32",
    "uint32_t": "UInt32", "uint8_t": "UInt8", "int8_t": "Int8", "uint16_t": "UInt16", "int16_t": "Int16",
}
# Julia names that are the same type.
JULIA_EQUIV = {"Cint": "Int32", "Cuint": "UInt32", "Cfloat": "Float32", "Cdouble": "Float64", "Csize_t": "UInt64",
               "Clonglong": "Int64", "Culonglong": "UInt64", "Cchar": "Int8", "Cvoid": "Nothing"}


def c_to_julia(ctype, hdr):
    """Canonical Julia type for a C type (a header_api.CType)."""
    base, stars = ctype.base, ctype.stars
    if base in hdr["handles"]:  # flashattn_plan_t -> struct flashattn_plan_s*
        return c_to_julia(CType("struct " + hdr["handles"][base], stars + 1, ctype.const), hdr)
    if base.startswith("struct "):
        # Opaque structs are only ever used through pointers: Ptr{Cvoid}.
        if stars == 0:
            raise ValueError("struct by value: %s" % ctype)
        return wrap_ptr("Ptr{Cvoid}", stars - 1)
    if base in hdr["enum_types"]:
        j = "Cint"
    elif base in hdr["structs"]:
        j = base
    elif base in C_SCALARS:
        j = C_SCALARS[base]
    else:
        raise ValueError("unknown C type %r" % str(ctype))
    if base == "char" and stars == 1:
        return "Cstring"  # const char* results/arguments
    return wrap_ptr(j, stars)


def wrap_ptr(j, stars):
    for _ in range(stars):
        j = "Ptr{%s}" % j
    return j


# ---------------------------------------------------------------- Julia parsing


def strip_julia_comments(text):
    text = re.sub(r"#=.*?=#", " ", text, flags=re.S)
    text = re.sub(r'"""(.*?)"""', '""', text, flags=re.S)  # docstrings
    return re.sub(r"#[^\n]*", "", text)


def match_paren(text, i):
    """Index of the parenthesis closing text[i] == '('."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced parentheses")


def parse_julia(text):
    text = strip_julia_comments(text)
    out = {"ccalls": [], "consts": {}, "aliases": {}, "structs": {}}
    for m in re.finditer(r"@ccall\s+(\w+)\.(\w+)\s*\(", text):
        lib, name = m.group(1), m.group(2)
        open_i = m.end() - 1
        close_i = match_paren(text, open_i)
        args = " ".join(text[open_i + 1:close_i].split())
        rest = text[close_i + 1:]
        rm = re.match(r"\s*::\s*([\w{}]+(?:\{[^\n]*?\})?)", rest)
        ret = rm.group(1) if rm else None
        types = []
        if args.strip():
            for a in split_top(args):
                if "::" not in a:
                    types.append(None)
                else:
                    types.append(a.rsplit("::", 1)[1].strip())
        line = text.count("\n", 0, m.start()) + 1
        out["ccalls"].append({"lib": lib, "name": name, "args": types, "ret": ret, "line": line})
    for m in re.finditer(r"^\s*const\s+(\w+)\s*=\s*(.+?)\s*$", text, flags=re.M):
        name, val = m.group(1), m.group(2)
        vm = re.fullmatch(r"(?:Cint|Int32|Int64|Int)?\(?\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*\)?", val)
        if vm:
            out["consts"][name] = int(vm.group(1), 0)
        elif re.fullmatch(r"[\w{}]+", val):
            out["aliases"][name] = val
        else:
            out["consts"][name] = val  # an expression; evaluated below if possible
    for name, val in list(out["consts"].items()):
        if isinstance(val, str):
            try:
                out["consts"][name] = int(eval_int(val, {k: v for k, v in out["consts"].items()
                                                            if isinstance(v, int)}))
            except ValueError:
                pass
    for m in re.finditer(r"^\s*(?:mutable\s+)?struct\s+(\w+)\s*\n(.*?)^\s*end\b", text, flags=re.M | re.S):
        fields = []
        for line in m.group(2).splitlines():
            fm = re.match(r"\s*(\w+)\s*::\s*(\S+)\s*$", line)
            if fm:
                fields.append((fm.group(1), fm.group(2)))
        out["structs"][m.group(1)] = fields
    return out


def resolve_julia(t, aliases):
    """Expand aliases inside a Julia type and canonicalize equivalent names."""
    if t is None:
        return None
    for _ in range(10):
        new = re.sub(r"\b(\w+)\b", lambda m: aliases.get(m.group(1), m.group(1)), t)
        if new == t:
            break
        t = new
    t = re.sub(r"\b(\w+)\b", lambda m: JULIA_EQUIV.get(m.group(1), m.group(1)), t)
    return t.replace(" ", "")


# ---------------------------------------------------------------- comparison


def compare(hdr, jl, lib_name="libflashattn"):
    problems = []
    aliases = jl["aliases"]

    def canon_c(ctype):
        return resolve_julia(c_to_julia(ctype, hdr), {})

    def same(ctype, jtype):
        want = canon_c(ctype)
        got = resolve_julia(jtype, aliases)
        if want == got:
            return True
        # const char* may be declared Cstring or Ptr{Cchar}/Ptr{UInt8}.
        if want == "Cstring" and got in ("Ptr{Int8}", "Ptr{UInt8}"):
            return True
        return False

    sites = {}
    for c in jl["ccalls"]:
        sites.setdefault(c["name"], []).append(c)
        if c["lib"] != lib_name:
            problems.append("line %d: @ccall %s.%s uses library %r, expected %r"
                            % (c["line"], c["lib"], c["name"], c["lib"], lib_name))
    for name in sorted(hdr["functions"]):
        if name not in sites:
            problems.append("function %s: no @ccall site in the Julia wrapper" % name)
    for name, calls in sorted(sites.items()):
        if name not in hdr["functions"]:
            problems.append("@ccall %s (line %d): not a function of the header" % (name, calls[0]["line"]))
            continue
        ret, params = hdr["functions"][name]
        for c in calls:
            where = "%s (line %d)" % (name, c["line"])
            if len(c["args"]) != len(params):
                problems.append("%s: %d arguments, the header has %d" % (where, len(c["args"]), len(params)))
                continue
            for i, (jt, ct) in enumerate(zip(c["args"], params)):
                if jt is None:
                    problems.append("%s: argument %d has no ::Type annotation" % (where, i + 1))
                elif not same(ct, jt):
                    problems.append("%s: argument %d is %s (= %s), the header's %s maps to %s"
                                    % (where, i + 1, jt, resolve_julia(jt, aliases), ct, canon_c(ct)))
            if c["ret"] is None:
                problems.append("%s: no return type annotation" % where)
            elif not same(ret, c["ret"]):
                problems.append("%s: returns %s, the header's %s maps to %s"
                                % (where, c["ret"], ret, canon_c(ret)))
    for name, val in sorted(hdr["enums"].items()):
        if name not in jl["consts"]:
            problems.append("enum constant %s = %d: missing in the Julia wrapper" % (name, val))
        elif jl["consts"][name] != val:
            problems.append("enum constant %s: Julia has %r, the header has %d" % (name, jl["consts"][name], val))
    for name, val in sorted(hdr["defines"].items()):
        if name not in jl["consts"]:
            problems.append("#define %s = %d: missing in the Julia wrapper" % (name, val))
        elif jl["consts"][name] != val:
            problems.append("#define %s: Julia has %r, the header has %d" % (name, jl["consts"][name], val))
    for name, fields in sorted(hdr["structs"].items()):
        if name not in jl["structs"]:
            problems.append("struct %s: missing in the Julia wrapper" % name)
            continue
        jf = jl["structs"][name]
        if [f for f, _ in jf] != [f for f, _ in fields]:
            problems.append("struct %s: fields %s, the header has %s"
                            % (name, [f for f, _ in jf], [f for f, _ in fields]))
            continue
        for (fname, ct), (_, jt) in zip(fields, jf):
            if not same(ct, jt):
                problems.append("struct %s field %s: %s, the header's %s maps to %s"
                                % (name, fname, jt, ct, canon_c(ct)))
    return problems


def check_files(header_path, julia_path):
    with open(header_path) as f:
        hdr = parse_header(f.read())
    with open(julia_path) as f:
        jl = parse_julia(f.read())
    problems = compare(hdr, jl)
    summary = ("%d functions, %d @ccall sites, %d enum constants, %d #defines, %d structs"
               % (len(hdr["functions"]), len(jl["ccalls"]), len(hdr["enums"]), len(hdr["defines"]),
                  len(hdr["structs"])))
    return problems, summary, hdr


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--header", default=os.path.join(REPO, "include", "flashattn.h"))
    ap.add_argument("--julia", default=os.path.join(HERE, "src", "FlashAttn.jl"))
    a = ap.parse_args(argv)
    problems, summary, hdr = check_files(a.header, a.julia)
    if not hdr["functions"]:
        print("FAIL: no functions parsed from %s" % a.header)
        return 1
    if problems:
        print("FAIL: %s does not match %s:" % (a.julia, a.header))
        for p in problems:
            print("  - " + p)
        return 1
    print("OK: %s matches %s (%s)" % (os.path.relpath(a.julia), os.path.relpath(a.header), summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
