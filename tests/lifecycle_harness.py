"""The core pipeline in a subprocess with settings, SIGKILLed at the n-th call of one function
(test_lifecycle_property).

    python lifecycle_harness.py INPUT WORK OUT SETTINGS_JSON [module:function n]

SETTINGS_JSON holds PlanConfig fields (max_len, algorithm, max_packs_per_shard, incremental).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import figure_stand_in  # noqa: E402
from fault_harness import arm  # noqa: E402


def main() -> None:
    inp, work, out = (Path(a) for a in sys.argv[1:4])
    figure_stand_in.swap()  # no test looks at the figures of a killed run or its rerun
    config = json.loads(sys.argv[4])
    if len(sys.argv) > 5:
        arm(sys.argv[5], int(sys.argv[6]))
    from pack_assets.core import store
    from pack_assets.core.audit import run_audit
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.report import WhatIfBeside
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.write import run_write

    profile = load_profile("qwen3-vl")
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    config = PlanConfig(**config)
    what_if = WhatIfBeside(work, config)  # as the pack_plan asset does
    what_if.finish(run_plan(work, shards, config, profile, on_lengths=what_if.start).fingerprint)
    run_write(work, inp, out, workers=1)
    result = run_audit(work, out)
    sys.exit(0 if result.ok else 3)


if __name__ == "__main__":
    main()
