#!/usr/bin/env python3
"""Instructions per operation of the pmrxe lcore, from callgrind dumps (scripts/instructions.sh).

usage: callgrind_ops.py MEASURED OPS IDLE IDLE_PASSES PASSES [--top N]

MEASURED is the lcore thread's dump over the measured run (OPS send WQEs), IDLE the dump of the
same lcore with the bench client connected and idle (IDLE_PASSES empty passes); PASSES is the
number of empty passes inside the measured run. With several lcores MEASURED and IDLE are
comma-separated lists of their dumps, summed (the pass counts are then all lcores' together). Prints JSON:

  per_op      instructions per operation in the functions that run only for work (frames,
              WQEs, ACKs, completions), less the control commands the harness's set-up makes
              in the window (CONTROL, inclusive): exact, the same from run to run;
  control_per_op those commands' instructions, per operation (they do not scale with it; the
              `top` list still holds their functions' share);
  loop_per_op the lcore loop's own instructions (polling, doorbell scan, bursts, timers) per
              operation, less the calibrated cost of the empty passes: an estimate;
  top         the per-op functions by exclusive instructions per operation.

Callgrind counts instructions retired, not time: it is deaf to the machine's moods (this VM's
timings vary 2x from run to run) and blind to cache misses and stalls. Valgrind has no AVX-512,
so the CRC kernels measured are the PCLMUL ones.
"""
import collections
import json
import re
import sys

# Functions of the lcore loop itself: they run every pass, with or without work.
LOOP = re.compile(
    r"Lcore<L>::run$|Lcore<L>>::(receive|transmit|doorbells|deliver_completions|drain_srqs)$|Ports<L>::flush$"
    r"|rx_burst|tx_burst|::kick$|try_recv|ArrayQueue<T>::pop$|Idle::idle|^0x[0-9a-f]+$|Engine<X>::(handle_timeout|drain_pending|transmit|deliver)$"
    r"|clock::|__tls_get_addr")


# Control commands (creating and destroying QPs, CQs, clients...): the harness makes a few at the
# start of every point, inside the measured window; their inclusive cost is left out of per_op,
# which otherwise depended on how many operations the window held.
CONTROL = re.compile(r"Lcore<L>>::command$")


def self_costs(path):
    """Exclusive Ir per function name (inlined code counts in the function it was inlined into),
    and the inclusive Ir of calls to CONTROL functions."""
    names, cur, callee, skip = {}, None, None, False
    cost = collections.Counter()
    control = 0
    with open(path) as f:
        for line in f:
            m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                kind, i, name = m.groups()
                if name:
                    names[i] = name
                if kind == "fn":
                    cur = names[i]
                else:
                    callee = names[i]
                continue
            if line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) >= 2:
                    if skip:
                        skip = False
                        if callee and CONTROL.search(callee) and not (cur and CONTROL.search(cur)):
                            control += int(parts[1])
                        continue
                    cost[cur] += int(parts[1])
    return cost, control


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = 25
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
        args.remove(str(top))
    measured, ops, idle, idle_passes, passes = args[0], int(args[1]), args[2], int(args[3]), int(args[4])
    if ops <= 0 or idle_passes <= 0:
        sys.exit("callgrind_ops: no operations or no idle passes measured")
    m, i, control = collections.Counter(), collections.Counter(), 0
    for path in measured.split(","):
        c, ctl = self_costs(path)
        m.update(c)
        control += ctl
    for path in idle.split(","):
        i.update(self_costs(path)[0])
    per_op = {fn: c for fn, c in m.items() if fn and not LOOP.search(fn)}
    loop = sum(c for fn, c in m.items() if fn and LOOP.search(fn))
    loop -= sum(c for fn, c in i.items() if fn and LOOP.search(fn)) * passes / idle_passes
    short = lambda fn: re.sub(r"<impl [^>]*>", "", fn)
    print(json.dumps({
        "ops": ops,
        "per_op": round((sum(per_op.values()) - control) / ops),
        "control_per_op": round(control / ops),
        "loop_per_op": round(max(loop, 0) / ops),
        "top": [[short(fn), round(c / ops, 1)] for fn, c in sorted(per_op.items(), key=lambda x: -x[1])[:top]],
    }))


if __name__ == "__main__":
    main()
