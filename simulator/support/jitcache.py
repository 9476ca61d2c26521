"""Where numba keeps the compiled code of ``cache=True`` functions, for any user of any install.

numba writes compiled code beside each module (its ``__pycache__``), or else to the user-wide cache
(``~/.cache/numba``). When neither is writable (a shared install read by a user whose home is read-only or
missing), numba refuses to define the functions at all (``RuntimeError: cannot cache function '_rotr'``), and every
command fails. Every module with compiled functions takes :func:`njit` from here, so this module runs before any of
them is defined; when the package folders are not writable (and the user set no ``NUMBA_CACHE_DIR``) it points
``NUMBA_CACHE_DIR`` at the first writable of:

1. the user's cache folder (``platformdirs``: ``~/.cache/treering/numba`` on Linux, ``$XDG_CACHE_HOME`` honoured);
2. a private folder in the temporary directory, ``treering-numba-UID``: created with mode 0700 and used only if it
   is this user's and writable by no one else (a cache holds code that will be run).

The compiled code a read-only install carries (its ``__pycache__``, warmed by whoever installed it) is copied into
that folder once, so a user does not compile it again; numba checks each entry against its source's hash as usual.
A writable install is left exactly as numba sets it (the code beside the modules).

:func:`njit` compiles each function once per argument types (:class:`OneSignature`: not once per constant it is
called with from compiled code), and :func:`is_cached` says whether the cache holds a function's code already (what
:mod:`simulator.engine.warmup` plans a first run's compiling by).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from numba.core import config, types
from numba.core.registry import CPUDispatcher

from simulator.support.compiling import listen

__all__ = ["CACHE_DIR", "COMPILED_FOLDERS", "OneSignature", "cache_subpath", "configure", "is_cached", "njit"]

_PACKAGE = Path(os.path.abspath(__file__)).parents[1]
# the folders of the modules with cache=True functions (tests/test_untrusted_inputs.py checks the list is whole)
COMPILED_FOLDERS: tuple[Path, ...] = tuple(_PACKAGE / name for name in ("cluster", "engine", "kernels", "schedule",
                                                                     "training"))
_CACHE_FILES = ("*.nbi", "*.nbc")


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (created if missing), tried as numba tries it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _user_cache() -> Path | None:
    try:
        import platformdirs
    except ImportError:  # pragma: no cover - a dependency; kept for a stripped install
        return Path.home() / ".cache" / "treering" / "numba"
    return Path(platformdirs.user_cache_dir("treering", appauthor=False)) / "numba"


def _private_temp() -> Path | None:
    """``TMPDIR/treering-numba-UID``, or ``None`` when it is not this user's alone."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    folder = Path(tempfile.gettempdir()) / f"treering-numba-{uid if uid is not None else 'user'}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022 or (uid is not None and st.st_uid != uid):
        return None
    return folder


def cache_subpath(folder: Path) -> str:
    """The folder numba's ``NUMBA_CACHE_DIR`` locator keeps a source folder's code in (its formula:
    ``numba.core.caching._CacheLocator.get_suitable_cache_subpath``, held to it by a test)."""
    return f"{folder.name}_{hashlib.sha1(str(folder).encode()).hexdigest()}"


def _seed(cache_dir: Path) -> None:
    """Copy the install's compiled code into ``cache_dir`` where numba will look for it (files it lacks only)."""
    for folder in COMPILED_FOLDERS:
        target = cache_dir / cache_subpath(folder)
        try:
            sources = [p for pattern in _CACHE_FILES for p in (folder / "__pycache__").glob(pattern)]
            if not sources:
                continue
            target.mkdir(parents=True, exist_ok=True)
            for src in sources:
                if (target / src.name).exists():
                    continue
                fd, tmp = tempfile.mkstemp(prefix=f".{src.name}.", dir=target)
                os.close(fd)
                shutil.copyfile(src, tmp)
                os.replace(tmp, target / src.name)
        except OSError:  # best effort: numba compiles what is missing
            continue


def configure() -> Path | None:
    """Point ``NUMBA_CACHE_DIR`` at a writable cache when the package folders are not writable (module docstring);
    the folder chosen, or ``None`` where numba's default stands (or no folder is writable)."""
    if os.environ.get("NUMBA_CACHE_DIR") or all(_writable(f / "__pycache__") for f in COMPILED_FOLDERS):
        return None
    user = _user_cache()
    for candidate in (user if user is not None and _writable(user) else None, _private_temp()):
        if candidate is not None and _writable(candidate):
            os.environ["NUMBA_CACHE_DIR"] = str(candidate)
            if "numba.core.config" in sys.modules:  # numba read its settings at import: read them again
                sys.modules["numba.core.config"].reload_config()
            _seed(candidate)
            return candidate
    return None


CACHE_DIR = configure()


class OneSignature(CPUDispatcher):
    """A compiled function called from compiled code with literal arguments (``_at(s, 0.0, READY, op)``, ``issue``
    ``True``) compiled once for their types (int64, bool), not once per constant: numba's own dispatcher compiles a
    specialization per literal it is called with (eleven of the event loop's ``_at`` on a fresh install, each a
    full compile of the function and everything it calls). Calls from Python already pass types, not literals."""

    def get_call_template(self, args: Any, kws: Any) -> Any:
        return super().get_call_template(tuple(types.unliteral(a) for a in args),
                                         {k: types.unliteral(v) for k, v in kws.items()})


def njit(*, cache: bool = False, **options: Any) -> Any:
    """``numba.njit(cache=..., **options)`` for the package's compiled functions (keyword arguments only), with
    :class:`OneSignature`'s dispatcher: one specialization per argument types."""
    def wrap(func: Any) -> Any:
        if config.DISABLE_JIT:  # type: ignore[attr-defined]
            return func
        disp = OneSignature(py_func=func, locals={}, targetoptions={**options, "nopython": True, "boundscheck": None})
        if cache:
            disp.enable_caching()
        return disp

    return wrap


def is_cached(disp: Any) -> bool:
    """Whether numba's cache holds ``disp``'s compiled code for its current source on this machine (any signature):
    loading it takes milliseconds, compiling it seconds. (Read off numba's cache index; where numba's internals are
    not as expected, ``True``: nothing is compiled ahead, the run compiles what it lacks as it goes.)"""
    try:
        cache = disp._cache
        index = cache._cache_file._load_index()
        codegen = disp.targetctx.codegen()
        return any(key == cache._index_key(key[0], codegen) for key in index)
    except Exception:  # numba's internals: any failure means "do not plan around it"
        return True


listen()  # a first run says what it compiles (simulator.support.compiling)
