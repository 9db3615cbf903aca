"""How much the decode kernel's launch order can matter: a simulation of its programs on the
offline workload's decode batches (kernels/decode_order.py quotes it; issue 9).

    python -m troupe.ops.decode_order_sim [--every 4] [--sms 132]

At every `every`-th decode step of ops/bench_offline's workload (all 256 sequences admitted,
sequence i at length prompt_i + t until it has its output), each (sequence, kv head) is one
program costing its length plus a fixed `overhead` in tokens; an SM holds R programs at once
and the GPU starts the next program in launch order whenever one ends. Printed per R: the
summed makespan over the ideal (work / slots, or the longest program) for batch order, sorted
within each kv head (the old grid, sequences fastest), and longest first with a sequence's
heads adjacent (the engine's order). A model of the scheduling only: memory bandwidth shared
by fewer programs at a step's end is not modelled, so the gains are upper bounds.
"""

from __future__ import annotations

import argparse
import heapq

from troupe.ops.bench_offline import workload

ORDERS = ("batch order", "sorted per head", "longest first")


def makespan(costs: list[int], slots: int) -> int:
    """When the last program ends, programs started in list order on `slots` slots."""
    ends = [0] * slots
    for cost in costs:
        heapq.heappush(ends, heapq.heappop(ends) + cost)
    return max(ends)


def ratios(
    resident: int, *, sms: int = 132, heads: int = 8, every: int = 4, overhead: int = 64
) -> dict[str, float]:
    """Summed makespan / summed ideal per order, at `resident` programs per SM."""
    prompts, outputs = workload(256, seed=0)
    slots = sms * resident
    total = dict.fromkeys(ORDERS, 0)
    ideal = 0.0
    for step in range(0, max(outputs), every):
        lens = [len(p) + step + overhead for p, n in zip(prompts, outputs, strict=True) if n > step]
        if not lens:
            break
        by_length = sorted(lens, reverse=True)
        total["batch order"] += makespan(lens * heads, slots)
        total["sorted per head"] += makespan(by_length * heads, slots)
        total["longest first"] += makespan([n for n in by_length for _ in range(heads)], slots)
        ideal += max(sum(lens) * heads / slots, max(lens))
    return {order: value / ideal for order, value in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=4, help="simulate every Nth decode step")
    parser.add_argument("--sms", type=int, default=132)
    args = parser.parse_args()
    print(f"{'programs per SM':>15} " + " ".join(f"{o:>16}" for o in ORDERS))
    for resident in (2, 3, 4, 6, 8):
        got = ratios(resident, sms=args.sms, every=args.every)
        print(f"{resident:>15} " + " ".join(f"{got[o]:>16.3f}" for o in ORDERS))


if __name__ == "__main__":
    main()
