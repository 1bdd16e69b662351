"""Memory model vs measured CPU proxy jobs, term by term.

Runs real megatron-core proxy jobs (bf16, as the analytic model assumes: 2 B weights, 4 B fp32 main grads,
12 B Adam state per parameter) on 4 gloo workers over a set of layouts (dense TP+PP, SP, VPP, distributed
optimizer, MoE with EP and ETP, full and selective recompute, CP), measures every rank's memory exactly
(`trainers.memory_probe`), and compares each pipeline stage with `autotune.cost.memory.estimate_memory_per_stage`
evaluated on the proxy's own shape with the proxy's assumptions (local unfused attention, no dropout).

Targets: weights, gradients and optimizer within 2%; activations within 15%.

    python bench/bench_memory_calibration.py            # about 2 to 3 minutes on 2 shared cores
    python bench/bench_memory_calibration.py --seq 128 --layers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYOUTS = [
    ("tiny-gpt", "tp=2,pp=2"),
    ("tiny-gpt", "tp=2,pp=2,sp=true"),
    ("tiny-gpt", "pp=2,vpp=2,dp=2"),
    ("tiny-gpt", "pp=2,dp=2,dist_opt=true"),
    ("tiny-gpt", "tp=2,dp=2,recompute=full"),
    ("tiny-gpt", "tp=2,dp=2,recompute=selective"),
    ("tiny-moe", "tp=2,ep=2,etp=1,sp=true"),
    ("tiny-moe", "ep=4,dp=4,dist_opt=true"),
    ("tiny-gpt", "tp=2,cp=2"),
]
TERMS = ("weights", "gradients", "optimizer", "activations")
TARGET = {"weights": 0.02, "gradients": 0.02, "optimizer": 0.02, "activations": 0.15}


def _measured_by_stage(m) -> dict[int, dict[str, float]]:
    """Per pipeline stage, each term's maximum over the stage's ranks."""
    out: dict[int, dict[str, float]] = {}
    for r in m.extra["memory_per_rank"]:
        stage = out.setdefault(r["pp_rank"], {t: 0.0 for t in TERMS})
        for t in TERMS:
            stage[t] = max(stage[t], r[t])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128, help="proxy sequence length (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="layers per virtual pipeline stage (default 2)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from autotune.tuning.measured import analytic_proxy_memory
    from search_spaces.catalog import get_model
    from search_spaces.gpus import build_cluster
    from search_spaces.job import Job
    from search_spaces.layout import parse_layout
    from search_spaces.training import TrainingSpec
    from trainers.backend import MegatronBackend, ensure_ray
    from trainers.worker_pool import shutdown_pool

    ensure_ray(tempfile.mkdtemp(prefix="autotune-bench-ray-"))
    backend = MegatronBackend(precision="bf16", warmup_steps=1, timed_steps=1, microbatches=args.microbatches,
                              proxy_layers_per_virtual_stage=args.layers, proxy_seq_length=args.seq)
    cluster = build_cluster(nodes=1, gpus_per_node=4)
    worst = {t: 0.0 for t in TERMS}
    print(f"{'layout':42s} {'stage':>5s} {'term':12s} {'measured B':>12s} {'analytic B':>12s} {'error':>8s}")
    t0 = time.perf_counter()
    for model_name, text in LAYOUTS:
        job = Job(model=get_model(model_name), cluster=cluster,
                  training=TrainingSpec(seq_length=4096, global_batch_size=64))
        layout = parse_layout(text, world_size=4)
        m = backend.evaluate(job, layout)
        label = f"{model_name} {text}"
        if m.status != "ok":
            print(f"{label:42s} {m.status}: {m.reason[:120]}")
            continue
        plan = backend.plan(job, layout, use_gpu=False, max_workers=4)
        analytic = {e["stage"]: e for e in analytic_proxy_memory(plan, per_stage=True)}
        for stage, measured in sorted(_measured_by_stage(m).items()):
            for term in TERMS:
                want = analytic.get(stage, {}).get(term)
                got = measured[term]
                err = (want - got) / got if want is not None and got else float("nan")
                if want is not None and got:
                    worst[term] = max(worst[term], abs(err))
                shown = want if want is not None else float("nan")
                print(f"{label:42s} {stage:5d} {term:12s} {got:12.0f} {shown:12.0f} {err:+8.1%}")
    shutdown_pool()
    print(f"\nworst |error| by term (analytic - measured) / measured, {time.perf_counter() - t0:.0f} s:")
    for term in TERMS:
        verdict = "ok" if worst[term] <= TARGET[term] else "MISSES TARGET"
        print(f"  {term:12s} {worst[term]:7.1%}  target {TARGET[term]:.0%}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
