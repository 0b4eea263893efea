"""The shared libclattn through ctypes: where it is found, its structs and
prototypes, and its statuses as Python exceptions.

ctypes calls a foreign function with the GIL released, so a long attention
call never blocks the interpreter's other threads, and a context shared by
threads works as in C (its calls take turns on the context's lock).
"""
import ctypes
import ctypes.util
import os

__all__ = ["lib", "Error", "InvalidArgument", "Shape", "Options", "DeviceInfo", "check",
           "DTYPE_F32", "DTYPE_F16", "DTYPE_BF16", "CAUSAL_TOP_LEFT", "CAUSAL_BOTTOM_RIGHT",
           "BACKENDS", "MAX_HEAD_DIM", "library_path"]

DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 1, 2
MAX_HEAD_DIM = 256
BACKENDS = {0: "auto", 1: "opencl-gpu", 2: "opencl-cpu", 3: "native"}
BACKEND_NATIVE = 3

# Statuses that mean the arguments were wrong, as opposed to a device or
# driver that failed: they raise InvalidArgument (a ValueError).
_ARGUMENT_STATUSES = {1, 2, 3, 4, 6, 7, 9, 10, 18, 20, 21, 22}


class Error(RuntimeError):
    """A clattn call failed. `status` is the C status name
    (e.g. "CLATTN_ERROR_BUILD_FAILED"); the message is clattn's own."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class InvalidArgument(Error, ValueError):
    """The arguments are wrong (shape, dtype, option, sequence lengths). It
    is both a ValueError and an Error (a RuntimeError), so that code written
    for PyTorch's errors catches it too."""


class Shape(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_uint32),
        ("q_seq", ctypes.c_uint32),
        ("kv_seq", ctypes.c_uint32),
        ("num_heads", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("causal", ctypes.c_int),
        ("window", ctypes.c_uint32),
        ("window_right", ctypes.c_uint32),
        ("scale", ctypes.c_float),
        ("dtype", ctypes.c_int),
        ("q_offset", ctypes.c_uint32),
        ("kv_offset", ctypes.c_uint32),
        ("accumulate", ctypes.c_int),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_uint32)),
        ("cu_seqlens_kv", ctypes.POINTER(ctypes.c_uint32)),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("sinks", ctypes.POINTER(ctypes.c_float)),
        ("score_fn", ctypes.c_char_p),
        ("mask_fn", ctypes.c_char_p),
        ("score_params", ctypes.POINTER(ctypes.c_float)),
        ("score_params_count", ctypes.c_uint32),
        ("score_native", ctypes.c_void_p),
        ("score_ds_native", ctypes.c_void_p),
        ("mask_native", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("bool_mask", ctypes.POINTER(ctypes.c_uint8)),
        ("bias_batch", ctypes.c_uint32),
        ("bias_heads", ctypes.c_uint32),
        ("bias_cl", ctypes.c_void_p),
        ("bool_mask_cl", ctypes.c_void_p),
        ("score_span_native", ctypes.c_void_p),
        ("bias_dtype", ctypes.c_int),
        ("score_dp_native", ctypes.c_void_p),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("device", ctypes.c_char_p),
        ("variant", ctypes.c_char_p),
        ("num_threads", ctypes.c_int),
    ]


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("platform_index", ctypes.c_int),
        ("device_index", ctypes.c_int),
        ("platform", ctypes.c_char * 128),
        ("name", ctypes.c_char * 128),
    ]


def _candidates():
    env = os.environ.get("CLATTN_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = sorted(n for n in os.listdir(here) if n.startswith("libclattn.so"))
    found = [os.path.join(here, n) for n in bundled]
    system = ctypes.util.find_library("clattn")
    if system:
        found.append(system)
    return found


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    where = "; ".join(tried) if tried else "none bundled with the package, none on the system"
    raise ImportError(
        "clattn: cannot load the shared library libclattn (" + where + "). Install the "
        "package with `pip install ./python`, or point CLATTN_LIBRARY at a libclattn.so.")


lib, library_path = _load()

_vp = ctypes.c_void_p
_sp = ctypes.POINTER(Shape)
_ctx = ctypes.c_void_p
_fp = ctypes.c_void_p  # float * (LSE), passed as an address
_PROTOTYPES = {
    "clattn_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "clattn_last_error": (ctypes.c_char_p, []),
    "clattn_version": (ctypes.c_char_p, []),
    "clattn_backend_name": (ctypes.c_char_p, [ctypes.c_int]),
    "clattn_options_default": (Options, []),
    "clattn_context_create": (ctypes.c_int, [ctypes.POINTER(Options), ctypes.POINTER(_ctx)]),
    "clattn_context_destroy": (None, [_ctx]),
    "clattn_context_backend": (ctypes.c_int, [_ctx]),
    "clattn_context_device": (ctypes.c_char_p, [_ctx]),
    "clattn_context_variant": (ctypes.c_char_p, [_ctx]),
    "clattn_context_kernels": (ctypes.c_char_p, [_ctx]),
    "clattn_context_log": (ctypes.c_char_p, [_ctx]),
    "clattn_shape_default": (Shape, []),
    "clattn_shape_validate": (ctypes.c_int, [_sp]),
    "clattn_shape_visible_pairs": (ctypes.c_uint64, [_sp]),
    "clattn_to_f32": (None, [ctypes.c_int, _vp, _vp, ctypes.c_size_t]),
    "clattn_from_f32": (None, [ctypes.c_int, _vp, _vp, ctypes.c_size_t]),
    "clattn_grad_v": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _fp, _vp]),
    "clattn_forward": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp]),
    "clattn_backward": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp, _vp, _vp, _vp, _vp]),
    "clattn_grad_q": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp, _vp, _vp]),
    "clattn_grad_k": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp, _vp, _vp]),
    "clattn_merge": (ctypes.c_int, [_ctx, _sp, _vp, _fp, _vp, _fp, _vp, _fp]),
    "clattn_grad_sinks": (ctypes.c_int, [_ctx, _sp, _vp, _fp, _vp, _fp]),
    "clattn_grad_bias": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp, _vp, _fp]),
    "clattn_grad_score_params": (ctypes.c_int, [_ctx, _sp, _vp, _vp, _vp, _vp, _fp, _vp, _fp]),
    "clattn_dropout_mask": (ctypes.c_int, [_sp, ctypes.c_uint32, ctypes.c_uint32, _vp]),
    "clattn_variant_name": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_size_t]),
    "clattn_native_wrapper": (ctypes.c_char_p, [ctypes.c_int]),
    "clattn_list_devices": (ctypes.c_int, [ctypes.POINTER(DeviceInfo), ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_size_t)]),
}
for _name, (_res, _args) in _PROTOTYPES.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def check(status, what, user_source=False):
    """Raises the exception for a non-zero status, with clattn's message for
    the calling thread's last failure; with user_source, a build failure is
    the caller's functions' (InvalidArgument)."""
    if status == 0:
        return
    name = lib.clattn_status_string(status).decode()
    detail = lib.clattn_last_error().decode(errors="replace")
    message = f"{what}: {name}: {detail}" if detail else f"{what}: {name}"
    if status == 19:
        raise NotImplementedError(message)
    cls = InvalidArgument if status in _ARGUMENT_STATUSES or (user_source and status == 13) \
        else Error
    raise cls(message, name)


def _version_matches():
    have = lib.clattn_version().decode()
    from . import __version__ as want
    if have.split(".")[0] != want.split(".")[0] or have.split(".")[:2] != want.split(".")[:2]:
        raise ImportError(f"clattn: the library at {library_path} is version {have}; this "
                          f"package needs {want} (the structs it passes must match)")
    return have
