"""The caller's score and mask functions (docs/programmable.md): OpenCL C
source that the OpenCL backends compile into their kernels, and that the
native backend runs after compiling the same text as C99 with the system's
C compiler ($CC, else cc), once per text in a process."""
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading

from . import _lib
from ._lib import InvalidArgument

_compiled = {}
_lock = threading.Lock()


def _text(name, source):
    if source is None:
        return None
    if not isinstance(source, str):
        raise TypeError(f"{name} must be OpenCL C source (a str), not {type(source).__name__}; "
                        "clattn compiles functions, it does not trace Python callables")
    if not source.strip() or "\0" in source:
        raise InvalidArgument(f"{name} is empty or holds a NUL character")
    return source


def _defines_dp(score):
    """Whether a score function's text defines clattn_score_dp, its
    derivative in its parameters (as the CLI tells too)."""
    return score is not None and "clattn_score_dp" in score


class Functions:
    """A score function (score_mod: clattn_score and clattn_score_ds, and
    clattn_score_dp where score_dp) and a mask function (mask_mod:
    clattn_mask), either may be None."""

    def __init__(self, score_mod=None, mask_mod=None):
        self.score = _text("score_mod", score_mod)
        self.mask = _text("mask_mod", mask_mod)
        self.score_dp = _defines_dp(self.score)
        self.score_bytes = self.score.encode() if self.score else None
        self.mask_bytes = self.mask.encode() if self.mask else None

    def __bool__(self):
        return self.score is not None or self.mask is not None

    def key(self):
        return (self.score or "", self.mask or "")

    def native(self):
        """(score, score_ds, score_span, mask) addresses of the C forms (None
        where not given), compiled on first use."""
        key = self.key()
        with _lock:
            if key not in _compiled:
                _compiled[key] = _compile(self.score, self.mask)
        lib = _compiled[key]
        addr = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        score = ("clattn_native_score", "clattn_native_score_ds", "clattn_native_score_span")
        return tuple(addr(n) if self.score else None for n in score) + (
            addr("clattn_native_mask") if self.mask else None,)

    def dp_native(self):
        """The address of the C form of clattn_score_dp (the score
        function's derivative in its parameters), or None where score_mod
        does not define it; compiled on first use."""
        if not self.score_dp:
            return None
        self.native()
        lib = _compiled[self.key()]
        return ctypes.cast(lib.clattn_native_score_dp, ctypes.c_void_p).value


def _compile(score, mask):
    cc = os.environ.get("CC") or "cc"
    folder = tempfile.mkdtemp(prefix="clattn-fn-")
    try:
        c_file, so_file = os.path.join(folder, "functions.c"), os.path.join(folder, "functions.so")
        with open(c_file, "w") as f:
            f.write(_lib.lib.clattn_native_wrapper(0).decode())
            if score:
                f.write(f'#line 1 "score_mod"\n{score}\n')
            if mask:
                f.write(f'#line 1 "mask_mod"\n{mask}\n')
            f.write('#line 1 "clattn wrapper"\n')
            f.write(_lib.lib.clattn_native_wrapper(1).decode())
        flags = ["-std=c99", "-O3", "-fno-trapping-math", "-fno-math-errno",
                 "-fvisibility=hidden", "-shared", "-fPIC"]
        flags += ["-DCLATTN_SCORE"] if score else []
        flags += ["-DCLATTN_SCORE_DP"] if _defines_dp(score) else []
        flags += ["-DCLATTN_MASK"] if mask else []
        # this machine's vector units for the span's loops, where cc knows the flag
        for arch in (["-march=native"], []):
            try:
                done = subprocess.run([cc, *flags, *arch, "-o", so_file, c_file, "-lm"],
                                      capture_output=True, text=True)
            except OSError as e:
                raise InvalidArgument(f"the native backend compiles score_mod and mask_mod "
                                      f"with {cc}: {e}") from None
            if done.returncode == 0:
                break
        if done.returncode != 0:
            raise InvalidArgument(f"{cc} did not compile the functions as C99 (the native "
                                  f"backend needs them valid C as well as OpenCL C):\n"
                                  f"{done.stderr}")
        return ctypes.CDLL(so_file)  # stays loaded once its file is gone
    finally:
        shutil.rmtree(folder, ignore_errors=True)
