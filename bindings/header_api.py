"""The C API of include/flashattn.h, parsed as text: the one header parser of the binding checks.

Used by bindings/julia/check_against_header.py, bindings/rust/check_sys_against_header.py
and bindings/python/tests/test_header_sync.py; each maps the C types below to its
language's types and compares. No compiler is needed.

parse_header(text) returns a dict:
  functions   {name: (CType return, [CType parameter, ...])} of every FLASHATTN_API function
  enums       {CONSTANT: value} of every enum constant
  enum_types  set of the enum typedef names
  structs     {typedef name: [(field, CType), ...]} of every `typedef struct ... { } name;`
  handles     {typedef name: struct tag} of every `typedef struct tag* name;` (opaque handles)
  defines     {FLASHATTN_NAME: value} of every #define with an integer constant value
A type the parser does not know (not a C scalar, enum, struct or handle of the header)
raises ValueError, so a new kind of declaration cannot slip past the checks.
"""
import re
from typing import NamedTuple

# C scalar types the header may use.
C_SCALARS = ("void", "char", "int", "unsigned int", "float", "double", "size_t", "int8_t", "uint8_t", "int16_t",
             "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t")


class CType(NamedTuple):
    """One C type: `const int64_t strides[4]` is CType("int64_t", 1, True)."""

    base: str     # scalar, enum, struct or handle typedef name, or "struct tag"
    stars: int    # pointer levels; an array parameter counts as one
    const: bool   # the declaration starts with const (it qualifies the innermost pointee)

    @property
    def spelled(self):
        """The type without const, as the ABI sees it: 'int64_t*'."""
        return self.base + "*" * self.stars

    def __str__(self):
        return ("const " if self.const else "") + self.spelled


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def eval_int(expr, names):
    """Value of an integer constant expression of C, Julia or Rust literals (0x7FFF_FFFF, 10u, 5LL),
    names from `names` and + - * ( ); ValueError if anything else is left."""
    expr = re.sub(r"\b(0[xX][0-9a-fA-F_]+|\d[\d_]*)[uUlL]*\b", lambda m: str(int(m.group(1).replace("_", ""), 0)),
                  expr.strip())
    expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda m: str(names[m.group(1)]) if m.group(1) in names else m.group(1),
                  expr)
    if not re.fullmatch(r"[\d\s()+\-*]+", expr):
        raise ValueError(expr)
    try:
        return eval(expr)  # only digits, spaces, parentheses and + - * remain
    except SyntaxError as e:
        raise ValueError(expr) from e


def split_top(s):
    """Split s at the commas outside any (), [], {} or <> pair."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "([{<"
        depth -= ch in ")]}>"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _ctype(decl, known, has_name=True):
    """CType of a declaration: 'const int64_t strides[4]', 'flashattn_plan_t* plan' or (has_name
    False) a bare type such as a return type."""
    decl = " ".join(decl.replace("FLASHATTN_API", " ").split())
    arr = decl.endswith("]")
    decl = re.sub(r"\s*\[[^\]]*\]$", "", decl)
    if has_name:
        decl = re.sub(r"\b\w+$", "", decl).strip()
    const = bool(re.match(r"const\b", decl))
    base = " ".join(re.sub(r"\bconst\b", " ", decl.replace("*", " ")).split())
    if base not in C_SCALARS and base not in known and not re.fullmatch(r"struct \w+", base):
        raise ValueError("unknown C type in %r" % decl)
    return CType(base, decl.count("*") + arr, const)


def parse_header(text):
    raw = text
    text = strip_c_comments(text)
    out = {"functions": {}, "enums": {}, "enum_types": set(), "structs": {}, "handles": {}, "defines": {}}
    for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        out["enum_types"].add(m.group(2))
        nxt = 0
        for item in m.group(1).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                k, v = (x.strip() for x in item.split("=", 1))
                nxt = eval_int(v, out["enums"])
            else:
                k = item
            out["enums"][k] = nxt
            nxt += 1
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\*\s*(\w+)\s*;", text):
        out["handles"][m.group(2)] = m.group(1)
    struct_re = r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;"
    known = out["enum_types"] | set(out["handles"]) | {m.group(2) for m in re.finditer(struct_re, text, flags=re.S)}
    for m in re.finditer(struct_re, text, flags=re.S):
        fields = []
        for decl in m.group(1).split(";"):
            decl = " ".join(decl.split())
            if decl:
                fields.append((re.search(r"(\w+)$", decl).group(1), _ctype(decl, known)))
        out["structs"][m.group(2)] = fields
    joined = re.sub(r"\\\n", " ", raw)
    for m in re.finditer(r"^#define\s+(FLASHATTN_\w+)\s+(.+?)\s*$", joined, flags=re.M):
        try:
            out["defines"][m.group(1)] = eval_int(m.group(2), {**out["enums"], **out["defines"]})
        except ValueError:
            pass  # not an integer constant (a function-like or attribute macro)
    for m in re.finditer(r"FLASHATTN_API\s+([^;{}()]*?)\b(flashattn_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.S):
        params = " ".join(m.group(3).split())
        plist = [] if params in ("", "void") else [_ctype(p, known) for p in split_top(params)]
        out["functions"][m.group(2)] = (_ctype(m.group(1), known, has_name=False), plist)
    return out
