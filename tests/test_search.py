"""The search's pieces without Ray: the define-by-run space, seeds, neighbours, and the searcher's
proposal loop (the Tune searcher around the guided strategy, stepped by hand here)."""

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.tuning.analytic_pass import analytic_pass
from autotune.tuning.driver import SearchPlan
from autotune.tuning.seeds import band_for, neighbours, parse_user_layouts, rule_of_thumb_seeds
from autotune.tuning.space_sampler import define_by_run, layout_of, params_of
from autotune.tuning.strategy import StrategyContext, make_strategy
from autotune.tuning.tune_glue import evaluate_trial, is_feasible
from autotune.tuning.tune_policy import PolicySearcher
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.rules import check
from search_spaces.space import SpaceOptions, feasible_space
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _job(model: str, nodes: int = 1, gpus_per_node: int = 8, seq: int = 4096, gbs: int = 256) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpus_per_node=gpus_per_node),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs))


SMALL = _job("tiny-gpt", gpus_per_node=2, seq=1024, gbs=16)  # 168 layouts (tiny: every one fits)
CASES = [SMALL, _job("tiny-moe", gpus_per_node=8, seq=1024, gbs=16), _job("mixtral-8x7b", nodes=4)]


@pytest.mark.parametrize("job", CASES, ids=lambda j: f"{j.model.name}-{j.world_size}gpu")
@pytest.mark.parametrize("naming", ["options", "path"])
def test_define_by_run_proposes_only_valid_layouts(job, naming):
    # random sampling exercises every branch of the space; 150 proposals, 0 may break a rule
    space = feasible_space(job, SpaceOptions())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    define = define_by_run(space, naming)
    invalid = 0
    for _ in range(150):
        trial = study.ask()
        define(trial)
        invalid += bool(check(job, layout_of(space, trial.params)))
        study.tell(trial, 0.0)
    assert invalid == 0


@pytest.mark.parametrize("naming", ["options", "path"])
def test_params_round_trip_every_layout_of_a_small_space(naming):
    space = feasible_space(SMALL, SpaceOptions())
    for layout in space.layouts():
        assert layout_of(space, params_of(space, layout, naming)) == layout


def test_a_parameter_name_always_offers_the_same_choices():
    # Optuna needs one fixed choice list per parameter name
    space = feasible_space(CASES[1], SpaceOptions())
    seen: dict[str, tuple] = {}

    class Recorder:
        def suggest_categorical(self, name, choices):
            assert seen.setdefault(name, tuple(choices)) == tuple(choices)
            return choices[len(seen) % len(choices)]

    for _ in range(50):
        define_by_run(space)(Recorder())
    assert len(seen) > 10


def test_params_of_rejects_a_layout_outside_the_space():
    space = feasible_space(SMALL, SpaceOptions())
    with pytest.raises(ValueError, match="outside the search space"):
        params_of(space, parse_layout("tp=4,dp=1"))  # 4 GPUs' worth on a 2-GPU job


@pytest.mark.parametrize("model, nodes, label", [
    ("mixtral-8x7b", 4, "MoE 20-100B"),
    ("llama3-70b", 4, "dense 70-175B"),   # 70.6B total parameters
    ("llama3-8b", 1, "dense 1-10B"),
    ("deepseek-v3", 32, "MoE 500B+"),
])
def test_band_follows_total_parameters(model, nodes, label):
    assert band_for(_job(model, nodes)).label.startswith(label)


@pytest.mark.parametrize("job", CASES, ids=lambda j: f"{j.model.name}-{j.world_size}gpu")
def test_rule_of_thumb_seeds_are_valid_layouts_of_the_space(job):
    space = feasible_space(job, SpaceOptions())
    seeds = rule_of_thumb_seeds(job, space)
    assert seeds
    for seed in seeds:
        assert check(job, seed.layout) == ()
        params_of(space, seed.layout)  # raises if outside the space


def test_mixtral_seeds_use_expert_parallelism():
    job = _job("mixtral-8x7b", nodes=4)
    seeds = rule_of_thumb_seeds(job, feasible_space(job, SpaceOptions()))
    assert all(s.layout.ep >= 8 for s in seeds)  # band: EP 8-16 (8 experts caps it at 8)


def test_user_layout_text_gets_dp_from_the_world():
    (seed,) = parse_user_layouts(_job("mixtral-8x7b", nodes=4), ["tp=2,pp=4,ep=8,sp=true"])
    assert seed.layout.dp == 4  # 32 / (2*4*1)


def test_user_layout_error_names_the_text():
    with pytest.raises(ValueError, match="--layout 'tp=two'"):
        parse_user_layouts(SMALL, ["tp=two"])


def test_neighbours_are_distinct_layouts_of_the_space():
    space = feasible_space(CASES[1], SpaceOptions())
    layout = next(iter(space.layouts()))
    near = neighbours(space, layout)
    assert near and layout not in near and len(set(near)) == len(near)
    for n in near:
        params_of(space, n)


def _plan(job: Job, *, budget: int, seed: int, headroom_bytes: float, options: SpaceOptions | None = None):
    space = feasible_space(job, SpaceOptions() if options is None else options)
    return SearchPlan(job=job, space=space, backend=AnalyticBackend(headroom_bytes=headroom_bytes),
                      backend_name="analytic", capacity_bytes=job.cluster.gpu.memory_bytes - headroom_bytes,
                      headroom_bytes=headroom_bytes, seed=seed, trials=budget, exhaustive=False, naming="options",
                      seeds=tuple(rule_of_thumb_seeds(job, space)), fixed=(), done=(), folder=Path("."))


def _step(plan, budget: int):
    answer = analytic_pass(plan.job, plan.space, capacity_bytes=plan.capacity_bytes)
    context = StrategyContext(job=plan.job, space=plan.space, analytic=answer, capacity_bytes=plan.capacity_bytes,
                              budget=budget, seed=plan.seed)
    searcher = PolicySearcher(make_strategy("guided", context))
    measured = []
    for t in range(budget):
        config = searcher.suggest(f"t{t}")
        if not isinstance(config, dict):
            break
        result = evaluate_trial(config, plan.job, plan.backend)
        searcher.on_trial_complete(f"t{t}", result)
        measured.append(parse_layout(config["layout"]))
    return searcher, measured


# llama3-8b on 8 A100-40GB, 4K tokens: 320 layouts, of which memory rules out more than half.
CONSTRAINED = Job(model=get_model("llama3-8b"), cluster=build_cluster(nodes=1, gpu="a100-40gb"),
                  training=TrainingSpec(seq_length=4096, global_batch_size=16))
CONSTRAINED_OPTIONS = SpaceOptions(micro_batch_sizes=(1, 2), recompute=("none", "full"), dist_opt=(True,))


@pytest.mark.parametrize("use_seeds", [True, False])
def test_search_best_equals_exhaustive_best_on_a_small_space(use_seeds):
    headroom = 4 * GIB
    plan = _plan(CONSTRAINED, budget=0, seed=0, headroom_bytes=headroom, options=CONSTRAINED_OPTIONS)
    if not use_seeds:
        plan = replace(plan, seeds=())
    scores = {}
    for layout in plan.space.layouts():
        m = plan.backend.evaluate(CONSTRAINED, layout)
        if is_feasible(m, plan.capacity_bytes):
            scores[layout] = m.tokens_per_s_per_gpu
    assert 0 < len(scores) < plan.space.size  # the constraint binds
    searcher, measured = _step(plan, 60)
    best = max(scores.get(lay, 0.0) for lay in measured)
    assert best == max(scores.values())
    assert all(not check(CONSTRAINED, lay) for lay in measured)  # every proposal is a valid layout


def test_the_searcher_never_runs_a_layout_twice():
    plan = _plan(SMALL, budget=60, seed=1, headroom_bytes=0.0)
    _, measured = _step(plan, 60)
    assert len(set(measured)) == 60


def test_searcher_covers_what_fits_when_the_budget_allows():
    # the guided strategy proposes only layouts the model says fit (equivalents merged), each once; with a budget
    # as large as the space it proposes all of them and then says it is finished
    job = _job("tiny-gpt", gpus_per_node=2, seq=1024, gbs=16)
    plan = _plan(job, budget=48, seed=2, headroom_bytes=0.0,
                 options=SpaceOptions(micro_batch_sizes=(1,), dist_opt=(True,), fsdp=(False,), offload_step=0,
                                      max_vpp=4))  # not the one-slot PP 2 x VPP 5 split
    assert plan.space.size <= 60
    _, measured = _step(plan, plan.space.size)
    answer = analytic_pass(plan.job, plan.space, capacity_bytes=plan.capacity_bytes)
    assert set(measured) == {answer.layout(int(i)) for i in answer.eligible.nonzero()[0]}


def test_autotune_search_is_the_api_function_after_the_driver_loads():
    import autotune
    import autotune.tuning.driver  # the driver module has its own name: nothing shadows the API function
    import autotune.ui.api

    assert autotune.search is autotune.ui.api.search


def test_neighbours_of_a_layout_outside_the_space_do_not_crash():
    # mixtral on 4 nodes: the recipe's tp1 pp4 vpp8 ep8 (one layer per chunk) is outside the default space; it
    # used to raise "not a prefix of any valid layout"; its neighbours are those of the nearest layout of the space
    from search_spaces.space import DEFAULT_SPACE

    job = _job("mixtral-8x7b", nodes=4)
    space = feasible_space(job, DEFAULT_SPACE)
    outside = parse_layout("tp=1,pp=4,vpp=8,ep=8,dist_opt=true", world_size=32)
    with pytest.raises(ValueError):
        params_of(space, outside)
    near = neighbours(space, outside)
    assert near and outside not in near
    for n in near:
        params_of(space, n)
