"""The ctypes prototypes, argument structs and enums of the binding match include/flashattn.h
(parsed as text by bindings/header_api.py, the header parser of every binding check)."""
import ctypes
import os
import sys

import pytest

from flashattn import _lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "bindings"))
import header_api  # noqa: E402

HEADER = os.path.join(REPO, "include", "flashattn.h")

SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "float": ctypes.c_float,
           "size_t": ctypes.c_size_t, "int32_t": ctypes.c_int32, "uint8_t": ctypes.c_uint8}


STRUCTS = {"flashattn_fwd_args_t": _lib.FwdArgs, "flashattn_bwd_args_t": _lib.BwdArgs,
           "flashattn_kvcache_config_t": _lib.KvcacheConfig, "flashattn_kvcache_args_t": _lib.KvcacheArgs,
           "flashattn_combine_args_t": _lib.CombineArgs}


@pytest.fixture(scope="module")
def hdr():
    with open(HEADER) as f:
        return header_api.parse_header(f.read())


def matches(ctype, pytype, hdr):
    """Does ctypes type `pytype` pass C type `ctype` (a header_api.CType, or its spelling
    without const such as 'int64_t*') correctly?"""
    if isinstance(ctype, header_api.CType):
        ctype = ctype.spelled
    if ctype == "void":
        return pytype is None
    if ctype == "char*":
        return pytype is ctypes.c_char_p
    stars = len(ctype) - len(ctype.rstrip("*"))
    base = ctype.rstrip("*")
    if base in hdr["handles"]:  # opaque handle typedef: one more pointer level
        stars += 1
    if stars:
        if pytype is ctypes.c_void_p:
            return True
        if hasattr(pytype, "_type_") and isinstance(pytype._type_, type) and issubclass(pytype, ctypes._Pointer):
            inner = base + "*" * (stars - 1) if base not in hdr["handles"] else base + "*" * (stars - 2)
            if stars - 1 == 0 and base in hdr["structs"]:
                return pytype._type_ is STRUCTS.get(base)
            return matches(inner if inner else "void*", pytype._type_, hdr)
        return False
    if base in hdr["enum_types"]:
        return pytype is ctypes.c_int
    return SCALARS.get(base) is pytype or (base in SCALARS and ctypes.sizeof(SCALARS[base]) == ctypes.sizeof(pytype)
                                           and SCALARS[base]._type_ == pytype._type_)


def test_every_function_has_a_matching_prototype(hdr):
    assert set(hdr["functions"]) == set(_lib.PROTOTYPES), "functions differ"
    for name, (ret, params) in hdr["functions"].items():
        restype, argtypes = _lib.PROTOTYPES[name]
        assert len(argtypes) == len(params), name
        assert matches(ret, restype, hdr), (name, ret, restype)
        for i, (c, p) in enumerate(zip(params, argtypes)):
            assert matches(c, p, hdr), (name, i, c, p)


@pytest.mark.parametrize("struct,cls", sorted(STRUCTS.items()))
def test_args_structs_match(hdr, struct, cls):
    fields = hdr["structs"][struct]
    assert [f for f, _ in fields] == [f for f, _ in cls._fields_]
    for (name, ctype), (_, pytype) in zip(fields, cls._fields_):
        assert matches(ctype, pytype, hdr), (struct, name, ctype, pytype)
    assert cls().struct_size == ctypes.sizeof(cls)


def test_enums_match(hdr):
    prefixes = {"FLASHATTN_STATUS_": _lib.Status, "FLASHATTN_BACKEND_": _lib.Backend, "FLASHATTN_DTYPE_": _lib.DType,
                "FLASHATTN_TENSOR_": _lib.Tensor, "FLASHATTN_ALGORITHM_": _lib.Algorithm,
                "FLASHATTN_ALIGN_": _lib.Align, "FLASHATTN_BIAS_": _lib.Bias, "FLASHATTN_PASS_": _lib.Pass,
                "FLASHATTN_ROTARY_": _lib.Rotary}
    seen = {e: set() for e in prefixes.values()}
    for name, value in hdr["enums"].items():
        prefix = next(p for p in prefixes if name.startswith(p))
        member = name[len(prefix):]
        if member == "MAX_ENUM":
            continue  # the 32-bit sentinel is not a value
        enum = prefixes[prefix]
        assert enum[member] == value, name
        seen[enum].add(member)
    for enum, members in seen.items():
        assert set(enum.__members__) == members, enum
    assert hdr["defines"]["FLASHATTN_VERSION_MAJOR"] == _lib.ABI_MAJOR
    assert hdr["defines"]["FLASHATTN_MAX_HEAD_DIM"] == _lib.MAX_HEAD_DIM
    assert hdr["defines"]["FLASHATTN_WINDOW_UNBOUNDED"] == _lib.WINDOW_UNBOUNDED


def test_a_drifted_prototype_is_caught(hdr):
    """Control: the comparison rejects a wrong type."""
    ret, params = hdr["functions"]["flashattn_plan_set_dropout"]
    assert not matches(params[2], ctypes.c_uint32, hdr)
    assert not matches(params[1], ctypes.c_double, hdr)
    assert not matches("int64_t*", ctypes.POINTER(ctypes.c_int32), hdr)
    assert matches("int64_t*", ctypes.POINTER(ctypes.c_int64), hdr)
