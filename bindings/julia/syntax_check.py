#!/usr/bin/env python3
"""Syntax check of the Julia sources without a Julia runtime, through the tree-sitter Julia
grammar (PyPI: tree-sitter, tree-sitter-julia). Exits 77 (skip) when those are not
installed, 1 on any parse error (with its position), 0 otherwise.

Usage: syntax_check.py [FILE.jl ...]   (default: src/FlashAttn.jl examples/attention.jl
                                        test/runtests.jl)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    try:
        import tree_sitter_julia
        from tree_sitter import Language, Parser
    except ImportError:
        print("SKIPPED: tree-sitter and tree-sitter-julia are not installed (pip install tree-sitter tree-sitter-julia)")
        return 77
    parser = Parser(Language(tree_sitter_julia.language()))
    files = argv or [os.path.join(HERE, *p) for p in (("src", "FlashAttn.jl"), ("examples", "attention.jl"),
                                                      ("test", "runtests.jl"))]
    bad = 0
    for path in files:
        with open(path, "rb") as f:
            src = f.read()
        errors = []

        def walk(node):
            if node.type == "ERROR" or node.is_missing:
                errors.append(node)
            for child in node.children:
                walk(child)

        walk(parser.parse(src).root_node)
        for n in errors[:20]:
            line, col = n.start_point
            text = src[n.start_byte:n.end_byte].decode(errors="replace").splitlines()
            print("%s:%d:%d: %s %r" % (path, line + 1, col + 1, "missing" if n.is_missing else "syntax error",
                                       text[0][:60] if text else n.type))
        print("%s: %s" % (os.path.relpath(path), "OK" if not errors else "%d parse errors" % len(errors)))
        bad += bool(errors)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
