#!/usr/bin/env python3
"""Compares the machine code (SASS) of every CUDA kernel between two versions of the tree.

    python3 scripts/sass_diff.py BEFORE [AFTER] [--arch sm_80 --arch sm_90a] [-j N] [--keep DIR]
                                 [--cache DIR]

BEFORE and AFTER are git revisions; AFTER defaults to the work tree. Each CUDA translation
unit (kernels/**/*.cu, src/cuda/*.cu) is compiled to a cubin per architecture with the
device flags of the CMake build (a unit of an architecture policy, *_<policy>.cu, only for
that policy's machine-code targets in kernels/instances.json), its SASS is dumped with cuobjdump and split per kernel.
Kernel names and mangled symbols inside the code are normalised away, so a kernel that
was renamed or moved to another file still matches: the report lists, per architecture,
the kernels whose normalised SASS exists on both sides (identical) and those that differ,
by their demangled names. Exit status 0 when every kernel is identical, 1 otherwise.
Needs nvcc, cuobjdump and nvdisasm (PATH or $CUDA_HOME/bin); no GPU.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Device-side flags of CMakeLists.txt (the CUDA compile options of the flashattn target).
NVCC_FLAGS = ["-O3", "-DNDEBUG", "--use_fast_math", "-std=c++17", "-DFLASHATTN_WITH_CUDA=1"]
INCLUDE_DIRS = ["include", "src", "kernels"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tool(name):
    path = shutil.which(name)
    if path is None:
        cand = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)
        if os.path.exists(cand):
            path = cand
    if path is None:
        sys.exit(f"sass_diff: {name} not found (PATH or $CUDA_HOME/bin)")
    return path


def export_tree(rev, dest):
    """Writes revision rev of the repository (None: the work tree) into dest."""
    if rev is None:
        files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                               check=True, capture_output=True).stdout.decode().split("\0")
        for f in filter(None, files):
            src = os.path.join(ROOT, f)
            if os.path.isfile(src):
                os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, f))
        return
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def policy_targets(tree):
    """{policy file suffix: set of sm_XX machine-code targets} from kernels/instances.json."""
    path = os.path.join(tree, "kernels", "instances.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        spec = json.load(f)
    return {p["name"].lower(): {"sm_" + t.split("-")[0] for t in p["targets"].split(";") if t.endswith("-real")}
            for p in spec.get("policies", [])}


def targets_of(src, archs, policies):
    """The requested architectures that the build compiles src for (a policy's unit: its own)."""
    m = re.search(r"_([a-z0-9]+)\.cu$", src)
    if m and m.group(1) in policies:
        return [a for a in archs if a in policies[m.group(1)]]
    return archs


def cuda_sources(tree):
    out = []
    for top in ("kernels", os.path.join("src", "cuda")):
        for dirpath, _, names in os.walk(os.path.join(tree, top)):
            if os.sep + "tests" in dirpath[len(tree):]:
                continue  # harnesses are programs, not library kernels
            out += [os.path.join(dirpath, n) for n in names if n.endswith(".cu")]
    return sorted(out)


SYMBOL = re.compile(r"_Z[0-9A-Za-z_$.]+")
FUNC = re.compile(r"^\s*Function : (\S+)\s*$")


def split_sass(text):
    """{mangled kernel name: normalised SASS} of one cuobjdump --dump-sass listing."""
    kernels, name, body = {}, None, []
    for line in text.splitlines():
        m = FUNC.match(line)
        if m or line.startswith("Fatbin "):  # a kernel, or the next fatbin entry's header
            if name:
                kernels[name] = "\n".join(body)
            name, body = (m.group(1) if m else None), []
        elif name:
            if line.strip().startswith(("code for", ".target", "....")):
                continue  # headers between the per-architecture listings
            body.append(SYMBOL.sub("SYM", line.rstrip()))
    if name:
        kernels[name] = "\n".join(body)
    return kernels


def compile_one(job):
    tree, src, arch, work, nvcc, cuobjdump = job
    rel = os.path.relpath(src, tree)
    cubin = os.path.join(work, rel.replace(os.sep, "__") + f".{arch}.cubin")
    cmd = [nvcc, *NVCC_FLAGS, *(f"-I{os.path.join(tree, d)}" for d in INCLUDE_DIRS), "-cubin", f"-arch={arch}",
           src, "-o", cubin]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return rel, arch, None, r.stderr
    sass = subprocess.run([cuobjdump, "--dump-sass", cubin], check=True, capture_output=True, text=True).stdout
    return rel, arch, split_sass(sass), None


def build(rev, archs, jobs, keep, cache):
    """{arch: {mangled name: (source, normalised SASS)}} of revision rev (None: work tree)."""
    label = rev or "work tree"
    cache_file = None
    if rev is not None and cache:
        sha = subprocess.run(["git", "-C", ROOT, "rev-parse", rev], check=True, capture_output=True,
                             text=True).stdout.strip()
        cache_file = os.path.join(cache, f"{sha}-{'-'.join(archs)}.json")
        if os.path.exists(cache_file):
            with open(cache_file) as f:
                return json.load(f)
    tree = tempfile.mkdtemp(prefix="sass_diff_src_")
    work = keep or tempfile.mkdtemp(prefix="sass_diff_obj_")
    os.makedirs(work, exist_ok=True)
    export_tree(rev, tree)
    nvcc, cuobjdump = tool("nvcc"), tool("cuobjdump")
    tool("nvdisasm")
    pol = policy_targets(tree)
    todo = [(tree, s, a, work, nvcc, cuobjdump) for s in cuda_sources(tree) for a in targets_of(s, archs, pol)]
    result = {a: {} for a in archs}  # arch -> mangled name -> (file, sass)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for rel, arch, kernels, err in pool.map(compile_one, todo):
            if err is not None:
                sys.exit(f"sass_diff: {label}: {rel} ({arch}) does not compile:\n{err}")
            print(f"  {label}: {rel} {arch}: {len(kernels)} kernel(s)", file=sys.stderr)
            for name, sass in kernels.items():
                result[arch][name] = (rel, sass)
    shutil.rmtree(tree)
    if not keep:
        shutil.rmtree(work)
    if cache_file:
        os.makedirs(cache, exist_ok=True)
        with open(cache_file, "w") as f:
            json.dump(result, f)
    return result


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out))


def digest(sass):
    # (Trailing blank lines depend on what follows the kernel in the listing.)
    return hashlib.sha256(sass.rstrip().encode()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after", nargs="?")
    ap.add_argument("--arch", action="append", help="cubin targets (default: sm_80 and sm_90a)")
    ap.add_argument("-j", type=int, default=1, help="parallel nvcc runs (default 1)")
    ap.add_argument("--keep", help="keep the cubins of both sides under this folder")
    ap.add_argument("--cache", help="reuse (or store) the SASS of a revision side in this folder")
    args = ap.parse_args()
    archs = args.arch or ["sm_80", "sm_90a"]
    sides = []
    for i, rev in enumerate((args.before, args.after)):
        keep = os.path.join(args.keep, "before" if i == 0 else "after") if args.keep else None
        sides.append(build(rev, archs, args.j, keep, args.cache))
    differ = 0
    for arch in archs:
        before, after = sides[0][arch], sides[1][arch]
        after_by_digest = {}
        for name, (rel, sass) in after.items():
            after_by_digest.setdefault(digest(sass), []).append(name)
        names = demangle(sorted(set(before) | set(after)))
        matched_after = set()
        same, changed = [], []
        for name, (rel, sass) in sorted(before.items()):
            hits = after_by_digest.get(digest(sass), [])
            if hits:
                same.append(name)
                matched_after.update(hits)
            else:
                changed.append(name)
        new = [n for n in sorted(after) if n not in matched_after]
        print(f"{arch}: {len(same)} of {len(before)} kernels byte-identical "
              f"(normalised names), {len(changed)} differ or are gone, {len(new)} without a twin")
        for n in changed:
            print(f"  before only: {names[n]}  [{before[n][0]}]")
        for n in new:
            print(f"  after only:  {names[n]}  [{after[n][0]}]")
        differ += len(changed) + len(new)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
