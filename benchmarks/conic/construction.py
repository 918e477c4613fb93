"""Layer construction time and memory for a sparse conic problem: dxopt.frontend vs cvxpylayers.

The problem (n variables, sparse): ``min ||D x - y||_2 + ||x||_1`` s.t. ``||x||_2 <= r`` with a
bidiagonal difference matrix ``D`` and parameters ``y`` (n - 1) and ``r``. Each peer builds
its layer in a fresh subprocess (so the peak resident memory is its own); the JSON and
Markdown go to benchmarks/conic/results/construction.{json,md}.

Run: ``python benchmarks/conic/construction.py --n 5000`` (the issue's size). Each child runs
under a wall-clock cap (``--timeout`` seconds) and an address-space cap (``--mem-gib``,
``RLIMIT_AS``); a peer that exceeds one is reported with the cap it hit, not dropped.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.common import machine_info, markdown_table, positive_int, results_dir, write_json  # noqa: E402

CHILD = r"""
import json, resource, sys, time
import numpy as np, scipy.sparse as sp, cvxpy as cp
n, peer = int(sys.argv[1]), sys.argv[2]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
D = sp.diags([np.ones(n - 1), -np.ones(n - 1)], [0, 1], shape=(n - 1, n))
x, y, r = cp.Variable(n), cp.Parameter(n - 1), cp.Parameter(nonneg=True)
prob = cp.Problem(cp.Minimize(cp.norm(D @ x - y, 2) + cp.norm(x, 1)), [cp.norm(x, 2) <= r])
if peer == "dxopt":
    from dxopt.frontend import CvxpyLayer
else:
    from cvxpylayers.torch import CvxpyLayer
t0 = time.perf_counter()  # the build only, imports done
layer = CvxpyLayer(prob, parameters=[y, r], variables=[x])
seconds = time.perf_counter() - t0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mib = {"peak_rss_mib": after / 1024, "added_mib": (after - before) / 1024}
print(json.dumps({"seconds": seconds, **mib}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, default=5000)
    parser.add_argument("--timeout", type=positive_int, default=1800)
    parser.add_argument("--mem-gib", type=positive_int, default=16)
    args = parser.parse_args()
    cap = args.mem_gib * 2**30

    def limit() -> None:  # runs in the child before exec
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    rows = []
    for peer in ("dxopt", "cvxpylayers"):
        try:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.n), peer],
                capture_output=True, text=True, timeout=args.timeout, check=False,
                preexec_fn=limit,
            )  # fmt: skip
            if out.returncode != 0:
                tail = out.stderr.strip()[-240:]
                if "MemoryError" in tail or out.returncode < 0:
                    cap_note = f"over the {args.mem_gib} GiB address-space cap?"
                    tail = f"{cap_note} rc {out.returncode}: {tail}"
                rows.append({"peer": peer, "n": args.n, "error": tail})
                continue
            rows.append(
                {"peer": peer, "n": args.n, **json.loads(out.stdout.strip().splitlines()[-1])}
            )
        except subprocess.TimeoutExpired:
            rows.append(
                {"peer": peer, "n": args.n, "error": f"over the {args.timeout} s cap (killed)"}
            )
    out_dir = results_dir("conic")
    write_json(out_dir / "construction.json", {"machine": machine_info(), "rows": rows})
    table = markdown_table(rows, ["peer", "n", "seconds", "peak_rss_mib", "added_mib", "error"])
    (out_dir / "construction.md").write_text(
        f"### Layer construction, sparse conic problem (n = {args.n})\n\n"
        f"caps per peer: {args.timeout} s, {args.mem_gib} GiB address space\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
