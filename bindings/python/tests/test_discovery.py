"""Library discovery: FLASHATTN_LIBRARY (file or directory), beside the package, the system
loader; and refusal of a library with the wrong major version. Each case runs in a fresh
interpreter so the discovery really happens."""
import os
import shutil
import subprocess
import sys

import pytest

import flashattn

PKG_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flashattn")
PROBE = "import flashattn, json; print(json.dumps([flashattn.library_path(), list(flashattn.version())]))"


def _lib_path():
    return os.path.realpath(flashattn.library_path())


def _run(pkg_parent, env_updates, code=PROBE):
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHATTN_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update({k: v for k, v in env_updates.items() if v is not None})
    env["PYTHONPATH"] = pkg_parent
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=pkg_parent)


@pytest.fixture
def pkg_copy(tmp_path):
    """A copy of the package with no library beside it."""
    dst = tmp_path / "site"
    shutil.copytree(PKG_SRC, dst / "flashattn", ignore=shutil.ignore_patterns("__pycache__", "libflashattn.so*"))
    return dst


def test_env_var_file(pkg_copy):
    r = _run(str(pkg_copy), {"FLASHATTN_LIBRARY": _lib_path()})
    assert r.returncode == 0, r.stderr
    assert _lib_path() in r.stdout
    assert "[0, " in r.stdout


def test_env_var_directory(pkg_copy):
    d = os.path.dirname(_lib_path())
    if not os.path.exists(os.path.join(d, flashattn.SONAME)):
        pytest.skip("no %s in %s" % (flashattn.SONAME, d))
    r = _run(str(pkg_copy), {"FLASHATTN_LIBRARY": d})
    assert r.returncode == 0, r.stderr
    assert os.path.join(d, flashattn.SONAME) in r.stdout


def test_env_var_missing_file_is_an_error_naming_it(pkg_copy):
    r = _run(str(pkg_copy), {"FLASHATTN_LIBRARY": "/nonexistent/libflashattn.so.0"})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "/nonexistent/libflashattn.so.0" in r.stderr


def test_env_var_not_flashattn(pkg_copy):
    import ctypes.util
    libm = ctypes.util.find_library("m")
    if not libm:
        pytest.skip("no libm to load")
    r = _run(str(pkg_copy), {"FLASHATTN_LIBRARY": libm})
    assert r.returncode != 0 and "is not libflashattn" in r.stderr


def test_beside_the_package(pkg_copy):
    shutil.copy(_lib_path(), pkg_copy / "flashattn" / flashattn.SONAME)
    r = _run(str(pkg_copy), {})
    assert r.returncode == 0, r.stderr
    assert str(pkg_copy / "flashattn" / flashattn.SONAME) in r.stdout


def test_system_loader(pkg_copy, tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copy(_lib_path(), libdir / flashattn.SONAME)
    r = _run(str(pkg_copy), {"LD_LIBRARY_PATH": str(libdir)})
    assert r.returncode == 0, r.stderr
    assert '"%s"' % flashattn.SONAME in r.stdout  # loaded by name through the loader


def test_wrong_major_version_is_refused(pkg_copy, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build a fake library")
    src = tmp_path / "fake.c"
    src.write_text("int flashattn_get_version(int* a, int* b, int* c) {"
                   " if (a) *a = 1; if (b) *b = 0; if (c) *c = 0; return 10000; }\n")
    so = tmp_path / "libflashattn.so.0"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    r = _run(str(pkg_copy), {"FLASHATTN_LIBRARY": str(so)})
    assert r.returncode != 0
    assert "version 1.0.0" in r.stderr and "needs 0.x" in r.stderr


def test_nothing_found(pkg_copy):
    r = _run(str(pkg_copy), {}, code="import flashattn\ntry:\n flashattn.version()\nexcept "
             "flashattn.LibraryNotFoundError as e:\n print('NOTFOUND', e)\n")
    # On a machine with libflashattn installed system-wide the loader finds it; otherwise
    # the error lists every place tried.
    assert r.returncode == 0, r.stderr
    if "NOTFOUND" in r.stdout:
        assert "FLASHATTN_LIBRARY" in r.stdout and "system loader" in r.stdout
