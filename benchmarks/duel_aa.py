"""An A/A duel on the GPU: a seed re-timed against a copy of itself (another file, the same kernel) in the loop's
ABAB order must come out "no significant difference" (agent/search/duel.py); a duel that crowned a copy would be the flaw
it exists to fix (BENCHMARKS.md).

    python3 benchmarks/duel_aa.py tasks/rmsnorm_fwd.py seeds/rmsnorm.py   (repo root, on a GPU; about a minute)

Written without a GPU (the session that wrote it could not run this branch on one): not run yet.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from agent.archive.records import Candidate
from agent.search.duel import LEGS, Bout, leg
from sandbox.harness import CheckOptions, Harness


def main(task: str, seed: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="duel-aa-"))
    copy = work / "copy.py"
    copy.write_text(Path(seed).read_text() + "\n# the same kernel in another file\n")
    paths = {"challenger": copy, "incumbent": Path(seed)}
    stub = {s: Candidate(task_path=task, task_hash="aa", origin="seed", proposer="seed", verdict="accepted",
                         reason="ok", source=p.read_text(), id=i + 1) for i, (s, p) in enumerate(paths.items())}
    bout = Bout(stub["challenger"], stub["incumbent"], 0, paths)
    with Harness("cuda", workdir=work / "sandbox") as harness:
        for side in LEGS:
            t0 = time.monotonic()
            result = harness.check(task, paths[side], CheckOptions(device="cuda", baselines=("eager",)))
            bout.legs.append(leg(side, result, time.monotonic() - t0))
            last = bout.legs[-1]
            print(f"{side:10s} {last.verdict} {last.speedup_eager}x [{last.ci_low}, {last.ci_high}] "
                  f"{len(last.rounds)} rounds, {last.seconds:.1f} s", flush=True)
    duel = bout.decide("aa")
    print(json.dumps({"outcome": duel.outcome.value, "speedup": duel.speedup, "ci": [duel.ci_low, duel.ci_high],
                      "n_pairs": duel.n_pairs, "note": duel.note}))
    return 0 if not duel.crowned else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
