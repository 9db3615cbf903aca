"""Builds and loads the native CPU kernels for 4-bit and Q8_0 weights (gpu/cpu_q4dot.c) on first
use (gpu/cpu_q4.py and gpu/cpu_q8.py hold the weights in its layouts).

gcc compiles the C file (-O3 -march=native, ~0.5 s) into a cache directory, one file per hash
of the source, the flags, the compiler's version and the CPU's flags, written under a temporary
name and renamed into place (two processes building at once are harmless); ctypes loads it.
Where the CPU has neither AVX-512 VNNI nor AVX2 (with FMA and F16C), there is no gcc, or the
build fails, `load_q4` says why in one log line and returns None: the caller keeps torch's int4
path (gpu/cpu_int4.py).

`Q4Lib.matmul` is the call the layers make per matmul; it takes raw addresses so a decode step's
call stays a few microseconds (the weight's part of the arguments is bound once per weight:
gpu/cpu_q4.py). A call splits its weight rows over `threads` threads of torch's own OpenMP pool
(-fopenmp links libgomp.so.1, which torch has already loaded): a pool of the library's own beside
torch's spinning workers fought them for the two cores here (docs/benchmarks.md, issue 16).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from troupe.config import EngineConfig

log = logging.getLogger(__name__)

# the matmuls, and the decode path's layers in one call (gpu/cpu_layers.c calls q4_matmul)
SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_q4dot.c", "cpu_layers.c"))
# what cpu_q4dot.c includes for the instruction set it is built for (hashed with the sources)
HEADERS = tuple(Path(__file__).with_name(f"cpu_q4dot_{isa}.h") for isa in ("avx512", "avx2"))
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fopenmp")
# The instruction sets gpu/cpu_q4dot.c is written for (either will do; the first is faster)
CPU_FLAG_SETS = (
    ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"),
    ("avx2", "fma", "f16c"),
)
# Least m * n * k worth splitting over the pool's threads (below it one thread runs the call:
# waking the other costs more than it saves)
MIN_SPLIT = 64 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class Q4Options:
    """EngineConfig's CPU kernel fields, as the loader needs them."""

    enabled: bool = True
    cache_dir: str | None = None  # None: ~/.cache/troupe/cpu_kernels
    threads: int = 0  # 0: torch.get_num_threads()

    @classmethod
    def from_config(cls, config: EngineConfig) -> Q4Options:
        return cls(
            enabled=config.cpu_native_kernels,
            cache_dir=config.cpu_kernel_cache_dir,
            threads=config.cpu_kernel_threads,
        )


class Q4Lib:
    """The loaded kernel library."""

    def __init__(self, path: Path, threads: int) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
        self.matmul = lib.q4_matmul
        self.matmul.argtypes = [vp, i32, i32, vp, vp, i32, i32, vp, i64, i64]
        self.matmul.restype = i32
        self.layers = lib.cl_layers  # gpu/cpu_layers.py
        self.layers.argtypes = [vp, i32, vp]
        self.layers.restype = i32
        self.quantize = lib.q4_quantize
        self.quantize.argtypes = [vp, i32, i32, vp, vp, vp, vp]
        self.quantize.restype = None
        self._set_threads = lib.q4_set_threads
        self._set_threads.argtypes = [i32, i32]
        self._set_threads.restype = i32
        self.threads = self.one_row_threads = 1
        self.set_threads(threads)

    def rows(self, x: torch.Tensor, codes: int, factors: int, form: int, n: int) -> torch.Tensor:
        """fp32 x [M, K] (contiguous) times the packed weight [n, K] at `codes` / `factors` of
        `form` (the C file's Q4_F16, Q4_F32, Q8_F16) -> fp32 [M, n]."""
        m, k = x.shape
        out = torch.empty((m, n))
        if self.matmul(x.data_ptr(), m, k, codes, factors, form, n, out.data_ptr(), n, MIN_SPLIT):
            raise MemoryError("native CPU kernel: out of memory for the activations")
        return out

    def set_threads(self, threads: int) -> int:
        """Threads per call from now on, the caller's included (0: torch's count, and one fewer
        for a call of one row until the decode path's tuner has timed both: a decode step's
        calls run while the engine's own threads stream the last token, and which count wins
        depends on the CPU, gpu/cpu_thread_tuner.py)."""
        count = threads or torch.get_num_threads()
        self.one_row_threads = max(1, threads or count - 1)
        self.threads = int(self._set_threads(count, self.one_row_threads))
        # auto: one-row calls may take 1 or all threads (gpu/cpu_thread_tuner.py decides)
        self.one_row_choices = (1, self.threads) if threads == 0 and self.threads > 1 else ()
        return self.threads

    def set_one_row_threads(self, threads: int) -> None:
        """Threads per one-row call from now on (at most the per-call count)."""
        self._set_threads(self.threads, threads)
        self.one_row_threads = max(1, threads)


_loaded: dict[Path, Q4Lib] = {}


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@functools.cache
def long_prefill_dtype() -> torch.dtype:
    """The dtype of a long prefill's GEMM over a 4-bit weight expanded per call: bf16 where the
    CPU multiplies it natively (AVX-512 BF16 or AMX), else fp32 (with AVX2 alone oneDNN's bf16
    GEMM runs ~5x slower than fp32: 118 vs 22 ms for 1,000 x 576 x 1,536 on this AMD EPYC)."""
    flags = cpu_flags()
    return torch.bfloat16 if {"avx512_bf16", "amx_bf16"} & flags else torch.float32


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "troupe" / "cpu_kernels"


def load_q4(options: Q4Options) -> Q4Lib | None:
    """The kernel library (built if its cache file is missing), or None (logged) where it
    cannot run here or is turned off."""
    if not options.enabled:
        return None
    flags = cpu_flags()
    if not any(flags.issuperset(needed) for needed in CPU_FLAG_SETS):
        lacks = " and ".join(
            "/".join(f for f in needed if f not in flags) for needed in CPU_FLAG_SETS
        )
        log.info("native int4 CPU kernel off: the CPU lacks %s; using torch's", lacks)
        return None
    compiler = shutil.which("gcc")
    if compiler is None:
        log.info("native int4 CPU kernel off: no gcc on PATH; using torch's int4 path")
        return None
    cache = Path(options.cache_dir) if options.cache_dir else default_cache_dir()
    try:
        path = _build(compiler, cache, flags)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("native int4 CPU kernel off: build failed (%s); using torch's", exc)
        return None
    lib = _loaded.get(path)
    if lib is None:
        lib = _loaded[path] = Q4Lib(path, options.threads)
    else:
        lib.set_threads(options.threads)
    return lib


def _build(
    compiler: str, cache: Path, cpu: frozenset[str], extra_flags: tuple[str, ...] = ()
) -> Path:
    """The library for this CPU (`extra_flags`: more gcc flags; tests build the AVX2 path on an
    AVX-512 CPU with -mno-avx512f), built unless its cache file exists."""
    flags = (*FLAGS, *extra_flags)
    source = b"\0".join(path.read_bytes() for path in SOURCES + HEADERS)
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, check=True, timeout=30
    ).stdout
    key = hashlib.sha256(
        b"\0".join([source, " ".join(flags).encode(), version, " ".join(sorted(cpu)).encode()])
    ).hexdigest()[:20]
    path = cache / f"cpu_q4dot-{key}.so"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", tmp, *map(str, SOURCES)], capture_output=True, timeout=120
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(done.stderr.decode(errors="replace").strip()[:400])
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built the native int4 CPU kernel: %s", path)
    return path
