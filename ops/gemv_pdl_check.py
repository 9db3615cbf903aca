"""Compile the decode GEMVs for sm_90 with and without PDL (kernels/gemv_pdl.py), no GPU needed.

    python3 -m troupe.ops.gemv_pdl_check

For each decode GEMV (int4 in its f16x2 and integer forms and fp8, in the column layout,
kernels/quant_int4.py and quant_fp8.py, at the engine's launch shapes, K split):

    pdl   the PTX holds griddepcontrol.launch_dependents and griddepcontrol.wait, and before
          the first wait it loads only weights (W, scales, biases: their addresses are traced
          through the PTX back to the kernel's parameters), at least one of them, never x,
          and stores nothing; the same PTX with the wait moved to the end must fail that
          (the check can fail)
    off   the PTX has no griddepcontrol

One line per kernel; `PDL CHECK OK` at the end, else `PDL CHECK FAILED` (exit 1).
Triton's bundled ptxas; pointers marked 16-byte divisible (ops/sm90_compile.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

import triton
from troupe.kernels import quant_fp8, quant_int4
from troupe.kernels.gemv_pdl import GDC, OFF
from troupe.ops.sm90_compile import compile_sm90


@dataclass(frozen=True)
class Kernel:
    fn: triton.JITFunction
    consts: dict[str, object]
    types: dict[str, str]
    weights: tuple[str, ...]  # the parameters that point at weights


_SPLIT = {"part_ptr": "*fp32", "counter_ptr": "*i32"}
KERNELS = [
    *(Kernel(quant_int4._int4_cols_gemv_kernel,
             {"BLOCK_N": 128, "GROUPS": 32, "EVEN_N": True, "PLAIN": False, "SPLIT": True,
              "ROWS": 1, "XQ8": xq8},
             {"w_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", **_SPLIT},
             ("w_ptr", "s_ptr", "b_ptr")) for xq8 in (False, True)),  # f16x2 and integer
    Kernel(quant_fp8._fp8_cols_gemv_kernel,
           {"BLOCK_N": 128, "BLOCKS": 16, "EVEN_N": True, "PLAIN": False},
           {"w_ptr": "*i32", "scale_ptr": "*fp32", **_SPLIT}, ("w_ptr", "scale_ptr")),
]  # fmt: skip
_REG = re.compile(r"%[a-z]+\d+")
_PARAM = re.compile(r"\[(\w+)_param_(\d+)\]")


def ptx_of(kernel: Kernel, pdl: bool) -> str:
    consts = {**kernel.consts, "PDL": GDC if pdl else OFF}
    return compile_sm90(kernel.fn, consts, kernel.types, num_warps=4, num_stages=3).ptx


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


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    good = True
    for kernel in KERNELS:
        head = kernel.fn.__name__
        names = kernel.fn.arg_names
        try:
            pdl = code_lines(ptx_of(kernel, True))
            ok, info = check_pdl(pdl, kernel, names)
            caught = not check_pdl(wait_moved_to_end(pdl), kernel, names)[0]
            off = code_lines(ptx_of(kernel, False))
        except Exception as exc:  # report and go on
            print(f"{head}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            good = False
            continue
        no_gdc = not any("griddepcontrol" in line for line in off)
        print(f"{head} pdl: {'ok' if ok else 'WRONG'} ({info}); the wait moved to the "
              f"end: {'rejected' if caught else 'NOT REJECTED'}")  # fmt: skip
        print(f"{head} off: {'ok' if no_gdc else 'WRONG'} (griddepcontrol "
              f"{'absent' if no_gdc else 'PRESENT'}, {len(off)} PTX lines)")  # fmt: skip
        good = good and ok and caught and no_gdc
    print("PDL CHECK OK" if good else "PDL CHECK FAILED")
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    main()
