"""Compile the decode GEMVs for sm_90 with and without PDL (kernels/gemv_pdl.py), no GPU needed.

    python3 -m troupe.ops.gemv_pdl_check [--against REV]

For each decode GEMV (int4 HALF2 and BYTES, fp8 HALF2 and BYTES, the Llama-8B launch shapes):

    pdl   the PTX holds griddepcontrol.launch_dependents and griddepcontrol.wait, and before
          the first wait it loads only weights (W, scales, biases: their addresses are traced
          through the PTX back to the kernel's parameters), at least one of them, never x,
          and stores nothing; the same PTX with the wait moved to the end must fail that
          (the check can fail)
    off   the PTX has no griddepcontrol and (--against REV, default the commit before PDL)
          is the PTX of the kernel at REV, line info aside: PDL False compiles to today's kernel

One line per kernel; `PDL CHECK OK` at the end, else `PDL CHECK FAILED` (exit 1).
Triton's bundled ptxas; pointers marked 16-byte divisible (ops/sm90_compile.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from types import ModuleType

import triton
from troupe.kernels import quant_bytes, quant_half2, quant_half2_fp8
from troupe.kernels.gemv_pdl import GDC, OFF
from troupe.ops.sm90_compile import compile_sm90

BEFORE_PDL = "7b043dd"  # the branch point: the kernels without PDL


@dataclass(frozen=True)
class Kernel:
    module: str  # the file under kernels/
    old: str  # the file under kernels/ that held it before PDL
    name: str
    consts: dict[str, object]
    types: dict[str, str]
    weights: tuple[str, ...]  # the parameters that point at weights


KERNELS = [
    Kernel("quant_half2", "quant_half2", "_int4_half2_kernel",
           {"BLOCK_N": 4, "GROUPS": 128, "PLAIN": False},
           {"w_ptr": "*i32", "scale_ptr": "*fp16", "bias_ptr": "*fp16"},
           ("w_ptr", "scale_ptr", "bias_ptr")),
    Kernel("quant_half2_fp8", "quant_half2_fp8", "_fp8_half2_kernel",
           {"BLOCK_N": 4, "QUADS": 128, "ONE_SCALE": False, "PLAIN": False},
           {"w_ptr": "*i32", "scale_ptr": "*fp32"}, ("w_ptr", "scale_ptr")),
    Kernel("quant_bytes", "quant_gemv", "_int4_gemv_kernel", {"G": 32, "BLOCK_N": 32, "BLOCK_K": 256},
           {"packed_ptr": "*u8", "scale_ptr": "*fp16", "bias_ptr": "*fp16"},
           ("packed_ptr", "scale_ptr", "bias_ptr")),
    Kernel("quant_bytes", "quant_gemv", "_fp8_gemv_kernel", {"BLOCK_N": 16, "BLOCK_K": 512},
           {"w_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}, ("w_ptr", "scale_ptr")),
]  # fmt: skip
MODULES: dict[str, ModuleType] = {
    "quant_half2": quant_half2,
    "quant_half2_fp8": quant_half2_fp8,
    "quant_bytes": quant_bytes,
}
_REG = re.compile(r"%[a-z]+\d+")
_PARAM = re.compile(r"\[(\w+)_param_(\d+)\]")


def ptx_of(fn: triton.JITFunction, kernel: Kernel, pdl: bool | None) -> str:
    consts = dict(kernel.consts) if pdl is None else {**kernel.consts, "PDL": GDC if pdl else OFF}
    return compile_sm90(fn, consts, kernel.types, num_warps=4, num_stages=3).ptx


def code_lines(ptx: str) -> list[str]:
    """The PTX's instructions, declarations and block labels: no line info, debug labels,
    comments or debug sections."""
    body = ptx.split(".section\t.debug", 1)[0].split(".section .debug", 1)[0]
    lines = [line.split("//")[0].strip() for line in body.splitlines()]
    return [
        line for line in lines
        if line and not line.startswith((".loc", ".file", "$L__tmp", "$L__func"))
    ]  # fmt: skip


def _parts(line: str) -> tuple[str, str]:
    """(opcode, operands) of an instruction, its guard (@%p1, @!%p1) dropped."""
    if line.startswith("@"):
        line = line.split(None, 1)[1]
    op, _, rest = line.partition(" ")
    return op, rest.strip().rstrip(";")


def param_sources(lines: list[str]) -> dict[str, set[int]]:
    """For every register, the kernel parameters (by index) its value is computed from."""
    deps: dict[str, set[int]] = {}
    for _ in range(3):  # loop-carried registers: a few passes reach the fixed point
        for line in lines:
            if line.startswith((".", "{", "}", "$")):
                continue
            op, rest = _parts(line)
            dst_text, _, src_text = rest.partition(",")
            if "{" in dst_text or op.startswith(("st.", "bra", "griddep")):
                continue  # vector destinations hold data, not addresses
            regs = _REG.findall(dst_text)
            if not regs:
                continue
            found = deps.setdefault(regs[0], set())
            for src in _REG.findall(src_text):
                found |= deps.get(src, set())
            if m := _PARAM.search(src_text):
                found.add(int(m.group(2)))
    return deps


def blocks(lines: list[str]) -> tuple[list[list[str]], list[list[int]]]:
    """The kernel's basic blocks (instructions) and each one's successors."""
    start = next(i for i, line in enumerate(lines) if line == "{") + 1
    body: list[list[str]] = [[]]
    labels: dict[str, int] = {}
    for line in lines[start:]:
        if line.endswith(":"):
            body.append([])
            labels[line[:-1]] = len(body) - 1
            continue
        if line in ("{", "}") or line.startswith("."):
            continue
        body[-1].append(line)
        if _parts(line)[0].startswith(("bra", "ret", "exit")):
            body.append([])
    succ: list[list[int]] = []
    for i, code in enumerate(body):
        last = _parts(code[-1]) if code else ("", "")
        nxt = [i + 1] if i + 1 < len(body) else []
        if last[0].startswith("bra"):
            target = [labels[last[1]]]
            succ.append(target if not code[-1].startswith("@") else target + nxt)
        elif last[0].startswith(("ret", "exit")):
            succ.append([])
        else:
            succ.append(nxt)
    return body, succ


def memory_ops(lines: list[str]) -> list[tuple[str, bool, set[int]]]:
    """Every global load and store: (ld / st, whether a griddepcontrol.wait comes before it on
    every path from the kernel's entry, the parameters its address comes from)."""
    deps = param_sources(lines)
    body, succ = blocks(lines)
    preds: list[list[int]] = [[] for _ in body]
    for i, out in enumerate(succ):
        for j in out:
            preds[j].append(i)
    waited_out = [True] * len(body)  # must-analysis: start from "waited", entry not
    for _ in range(len(body) + 1):
        for i, code in enumerate(body):
            state = i != 0 and all(waited_out[p] for p in preds[i])
            waited_out[i] = state or any("griddepcontrol.wait" in line for line in code)
    ops = []
    for i, code in enumerate(body):
        state = i != 0 and all(waited_out[p] for p in preds[i])
        for line in code:
            op, rest = _parts(line)
            state = state or op.startswith("griddepcontrol.wait")
            if op.startswith(("ld.global", "st.global")):
                at = rest[rest.index("[") :].split("]")[0]
                params: set[int] = set()
                for reg in _REG.findall(at):
                    params |= deps.get(reg, set())
                ops.append((op[:2], state, params))
    return ops


def wait_moved_to_end(lines: list[str]) -> list[str]:
    """The kernel with its griddepcontrol.wait moved to just before its return: a wrong kernel
    (x read and y stored before the wait) that check_pdl must reject."""
    kept = [line for line in lines if "griddepcontrol.wait" not in line]
    end = max(i for i, line in enumerate(kept) if _parts(line)[0].startswith("ret"))
    return [*kept[:end], "griddepcontrol.wait;", *kept[end:]]


def check_pdl(lines: list[str], kernel: Kernel, names: list[str]) -> tuple[bool, str]:
    text = "\n".join(lines)
    if "griddepcontrol.launch_dependents" not in text or "griddepcontrol.wait" not in text:
        return False, "no griddepcontrol.launch_dependents / wait"
    weights = {names.index(w) for w in kernel.weights}
    x = names.index("x_ptr")
    pointers = {i for i, name in enumerate(names) if name.endswith("_ptr")}
    early = {"weights": 0, "x": 0, "stores": 0, "other": 0}
    late = 0
    for kind, waited, params in memory_ops(lines):
        if waited:
            late += kind == "ld"
        elif kind == "st":
            early["stores"] += 1
        else:
            base = params & pointers  # the tensors the address points into
            key = "x" if x in base else "weights" if base and base <= weights else "other"
            early[key] += 1
    ok = early["weights"] > 0 and early["x"] == early["stores"] == early["other"] == 0
    info = (
        f"before the wait: {early['weights']} weight loads, {early['x']} x loads, "
        f"{early['other']} other loads, {early['stores']} stores; {late} loads after"
    )
    return ok, info


def old_module(rev: str, module: str, tmp: str) -> ModuleType:
    """kernels/<module>.py as it was at `rev`, imported from a file of its own."""
    src = subprocess.run(
        ["git", "show", f"{rev}:kernels/{module}.py"],
        capture_output=True, text=True, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    ).stdout  # fmt: skip
    path = os.path.join(tmp, f"old_{module}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"old_{module}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--against", default=BEFORE_PDL, help="PDL off must match this commit ('': no compare)"
    )
    args = parser.parse_args()
    good = True
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in KERNELS:
            fn = getattr(MODULES[kernel.module], kernel.name)
            head = f"{kernel.module}.{kernel.name}"
            try:
                pdl = code_lines(ptx_of(fn, kernel, True))
                ok, info = check_pdl(pdl, kernel, fn.arg_names)
                caught = not check_pdl(wait_moved_to_end(pdl), kernel, fn.arg_names)[0]
                off = code_lines(ptx_of(fn, kernel, False))
                old = off
                if args.against:
                    old = code_lines(ptx_of(getattr(old_module(args.against, kernel.old, tmp),
                                                    kernel.name), kernel, None))  # fmt: skip
            except Exception as exc:  # report and go on
                print(f"{head}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                good = False
                continue
            no_gdc = not any("griddepcontrol" in line for line in off)
            same = off == old
            print(f"{head} pdl: {'ok' if ok else 'WRONG'} ({info}); the wait moved to the "
                  f"end: {'rejected' if caught else 'NOT REJECTED'}")  # fmt: skip
            print(f"{head} off: {'ok' if no_gdc and same else 'WRONG'} (griddepcontrol "
                  f"{'absent' if no_gdc else 'PRESENT'}, {len(off)} PTX lines, "
                  f"{'same as' if same else 'DIFFERENT from'} {args.against or 'itself'})")  # fmt: skip
            good = good and ok and caught and no_gdc and same
    print("PDL CHECK OK" if good else "PDL CHECK FAILED")
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    main()
