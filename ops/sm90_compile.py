"""A Triton kernel compiled for sm_90 (the H200) on a machine without a GPU: registers, spill
stack, shared memory, and the TTGIR / PTX / SASS to read, from triton's bundled ptxas and cuobjdump.
ops/fp8_compile_check.py and ops/mla_compile_check.py print their kernels' figures with it;
ops/gemv_pdl_check.py reads the PTX of the decode GEMVs with and without PDL.

A Gluon kernel (ops/fp8_gluon_probe.py) compiles the same way. Pointer arguments default to
bf16 and the rest to i32 (`types` overrides by name); pointers and strides are marked divisible
by 16, as the real launches specialise them.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass(frozen=True)
class Sm90Build:
    regs: int  # per thread (255 when cuobjdump does not say)
    stack: int  # spill stack bytes (-1 when cuobjdump does not say)
    smem: int  # shared memory bytes per program
    ttgir: str
    sass: str  # empty unless asked for
    ptx: str = ""

    def programs_per_sm(self, num_warps: int) -> int:
        """Programs an SM holds by registers and shared memory."""
        return min(65536 // (self.regs * 32 * num_warps), 232448 // max(self.smem, 1))


def compile_sm90(
    kernel: triton.JITFunction,
    consts: dict[str, object],
    types: dict[str, str],
    num_warps: int,
    num_stages: int,
    *,
    sass: bool = False,
    maxnreg: int | None = None,
) -> Sm90Build:
    names = kernel.arg_names
    signature = {
        n: "constexpr" if n in consts else types.get(n, "*bf16" if n.endswith("_ptr") else "i32")
        for n in names
    }  # fmt: skip
    aligned = [i for i, n in enumerate(names) if n.endswith("_ptr") or n.startswith("stride")]
    source = GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource
    src = source(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    options: dict[str, object] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tool = os.path.join(_BIN, "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout  # fmt: skip
        code = ""
        if sass:
            code = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                                  check=True).stdout  # fmt: skip
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return Sm90Build(
        regs=int(regs.group(1)) if regs else 255,
        stack=int(stack.group(1)) if stack else -1,
        smem=int(compiled.metadata.shared),
        ttgir=compiled.asm["ttgir"],
        sass=code,
        ptx=compiled.asm["ptx"],
    )
