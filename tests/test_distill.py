
import copy
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from icl_ssm.cli import main
from icl_ssm.compress.cache import dense_cache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.distill import spec as SP
from icl_ssm.distill import teacher as TT
from icl_ssm.distill import train as distill_train
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.losses import bucket_kl, kv_alignment_loss, label_kl, rank_loss
from icl_ssm.distill.targets import pool_kv, teacher_targets
from icl_ssm.distill.train import group_losses, training_states
from icl_ssm.lm.models import load_model

SMALL = ["--model", "tiny-llama", "--task", "coin_flip", "--k", "4", "--samples", "8", "--queries", "2",
         "--group-size", "2", "--state-size", "16", "--num-virtual", "4", "--num-sink", "2", "--latent-size", "8",
         "--lambda-rank", "1.0", "--checkpoint-every", "2"]


def weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


def same_weights(a: Path, b: Path, atol: float = 0.0) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], rtol=0, atol=atol) for k in wa)


# --- losses -----------------------------------------------------------------------------


def test_kv_alignment_loss_is_zero_for_the_targets_and_scale_free():
    pool = torch.randn(3, 2, 2, 4, 8)  # (B, m, H_kv, n_v, d)
    keys = pool.transpose(0, 1) * 5  # (m, B, ...), scaled: cosine ignores scale
    assert kv_alignment_loss(keys, keys, pool, pool).abs().item() < 1e-6
    assert kv_alignment_loss(-keys, keys, pool, pool).item() == pytest.approx(2.0, abs=1e-5)


def test_bucket_kl_is_zero_on_the_teacher_and_positive_elsewhere():
    logits = torch.randn(5, 50)
    logp = torch.log_softmax(logits, -1)
    top_logp, top_idx = logp.topk(8, dim=-1)
    assert bucket_kl(logp, top_idx, top_logp, 2.0).abs().max().item() < 1e-5
    other = torch.log_softmax(torch.randn(5, 50), -1)
    assert (bucket_kl(other, top_idx, top_logp, 2.0) > 0).all()


def test_rank_loss_only_sees_differences_between_subsets():
    teacher = torch.randn(4, 6)
    assert rank_loss(teacher + torch.randn(1, 6) * 3, teacher).item() < 1e-10  # per-query shifts
    assert rank_loss(teacher.flip(0), teacher).item() > 0.01


def test_subset_level_rank_loss_sees_only_subset_means():
    teacher = torch.randn(4, 6)
    interaction = torch.randn(4, 6)
    interaction -= interaction.mean(1, keepdim=True)  # how a subset suits each query, mean 0 per subset
    student = teacher + interaction + torch.randn(1, 6)
    assert rank_loss(student, teacher, "subset").item() < 1e-10
    assert rank_loss(student, teacher, "query").item() > 0.01
    means = teacher.mean(1, keepdim=True)
    want = ((means - means.mean()) * 2 - (means - means.mean())).pow(2).mean()  # student's spread doubled
    torch.testing.assert_close(rank_loss(teacher * 0 + 2 * means, teacher, "subset"), want)
    with pytest.raises(ValueError, match="rank level 'pairs'; accepted: query, subset"):
        rank_loss(teacher, teacher, "pairs")
    with pytest.raises(ValueError, match="rank_level 'pairs'; accepted: query, subset"):
        DistillConfig(rank_level="pairs")


def test_a_bad_ssm_input_shape_is_refused_before_any_work(tmp_path):
    from icl_ssm_bench.synthetic.study import distill_synthetic

    with pytest.raises(ValueError, match="pair_window must be a positive integer, got 0"):
        DistillConfig(pair_size=4, pair_window=0)
    with pytest.raises(ValueError, match=r"input_rank must be an integer >= 0 \(0: off\), got -1"):
        DistillConfig(input_rank=-1)
    from icl_ssm_bench.synthetic.task import RegressionTask
    from icl_ssm_bench.synthetic.teacher import RegressionTeacherConfig, train_teacher

    teacher = tmp_path / "teacher"
    config = RegressionTeacherConfig(n_dims=3, max_pairs=4, hidden_size=16, intermediate_size=32)
    train_teacher(config, RegressionTask("linear", d=3, clusters=2, seed=0), teacher, steps=2, batch=4)
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="pair_size must be an integer >= 0"):
        distill_synthetic(teacher, out, k=2, samples=4, pair_size=-3)
    assert not out.exists()  # refused before the output directory was made


# --- teacher cache ------------------------------------------------------------------------


def spec(**kw):
    base = dict(model="tiny-llama", model_fingerprint="x", tasks=("coin_flip",), k=4, episodes=8, queries=2,
                group_size=2, num_virtual=4, num_sink=2, topk=8, shard_size=3)
    base.update(kw)
    return SP.TeacherSpec(**base)


def test_episodes_are_deterministic_grouped_and_disjoint():
    s = spec(episodes=7, group_size=3)
    a, b = TT.sample_episodes([100], s), TT.sample_episodes([100], s)
    assert a == b and len(a) == 7
    for e in a:
        assert len(set(e.demos)) == 4 and not set(e.demos) & set(e.queries)
    assert a[0].queries == a[1].queries == a[2].queries and a[0].demos != a[1].demos
    assert a[3].group == 1 and a[3].queries != a[0].queries
    with pytest.raises(ValueError, match="fewer than k \\+ queries"):
        TT.sample_episodes([5], s)


def test_shared_tail_groups_differ_only_before_their_last_demonstrations():
    plain, tailed = spec(episodes=6, group_size=3), spec(episodes=6, group_size=3, shared_tail=2)
    assert tailed.key() != plain.key()
    assert plain.key() == "971095e0f6547f29"  # the key of a cache written before shared_tail existed
    eps = TT.sample_episodes([100], tailed)
    assert eps == TT.sample_episodes([100], tailed)
    for group in (eps[:3], eps[3:]):
        assert len({e.demos[-2:] for e in group}) == 1  # one tail per group
        assert len({e.demos[:-2] for e in group}) == 3
        for e in group:
            assert len(set(e.demos)) == 4 and not set(e.demos) & set(e.queries)
    assert eps[0].demos[-2:] != eps[3].demos[-2:]
    mixed = TT.sample_episodes([100], spec(episodes=6, group_size=3, shared_tail=2, shared_tail_every=2))
    assert len({e.demos[-2:] for e in mixed[:3]}) == 3 and len({e.demos[-2:] for e in mixed[3:]}) == 1
    assert spec(shared_tail_every=1).key() == spec().key()
    with pytest.raises(ValueError, match="shared_tail_every must be a positive integer, got 0"):
        spec(shared_tail_every=0)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=f"shared_tail must be an integer in \\[0, k=4\\), got {bad}"):
            spec(shared_tail=bad)


def test_teacher_cache_round_trip_and_refusals(tmp_cache, tmp_path):
    model, tok = load_model("tiny-llama")
    s = spec(model_fingerprint=SP.model_fingerprint(model))
    d = TT.build_teacher_cache(model, tok, s, tmp_path / "tc")
    cache = TT.TeacherCache.open(d, s)
    assert len(cache) == 8
    e = cache.get(4)
    assert e["pool_k"].shape == (2, 2, 4, 8) and e["hidden"].shape == (2, 2, 32)
    assert len(e["query_ids"]) == 2 and e["top_logp"].shape == (2, 8)
    # the stored first-token gold log-prob is what a fresh dense pass gives
    assert torch.isfinite(e["gold_logp"]).all() and (e["gold_logp"] <= 0).all()
    with pytest.raises(ValueError, match="k: cache has 4, requested 5"):
        TT.TeacherCache.open(d, spec(model_fingerprint=s.model_fingerprint, k=5))
    with pytest.raises(ValueError, match="other settings"):
        TT.build_teacher_cache(model, tok, spec(model_fingerprint="other"), d)
    # every file is complete and readable by the others who share the cache; no temporary left behind
    shards = [f"shard-{j:05d}.safetensors" for j in range(s.num_shards)]
    assert sorted(p.name for p in d.iterdir()) == ["episodes.json", "meta.json", *shards]
    assert {oct(p.stat().st_mode & 0o777) for p in d.iterdir()} == {oct(0o666 & ~umask())}
    (d / "shard-00001.safetensors").unlink()
    with pytest.raises(ValueError, match="incomplete"):
        TT.TeacherCache.open(d)


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_runs_that_open_one_teacher_cache_at_once_do_not_collide(tmp_cache, tmp_path, monkeypatch):
    """Two runs starting on one cache (a compressor and its control) both rewrite its episode
    list: each through a temporary file of its own, so neither moves the other's away."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    model, tok = load_model("tiny-llama")
    s = spec(model_fingerprint=SP.model_fingerprint(model))
    d = TT.build_teacher_cache(model, tok, s, tmp_path / "tc")
    real, both_written = os.replace, threading.Barrier(2, timeout=30)

    def replace(src, dst):  # both runs have written their episode list before either renames it
        if str(dst).endswith("episodes.json"):
            both_written.wait()
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(TT.build_teacher_cache, model, tok, s, d) for _ in range(2)]
        assert [r.result() for r in runs] == [d, d]
    assert len(TT.TeacherCache.open(d, s)) == 8


def test_a_larger_cache_reuses_the_shards_of_a_smaller_one(tmp_cache, tmp_path, monkeypatch):
    model, tok = load_model("tiny-llama")
    fp = SP.model_fingerprint(model)
    small = TT.build_teacher_cache(model, tok, spec(model_fingerprint=fp), tmp_path / "root" / "small")
    other = TT.build_teacher_cache(model, tok, spec(model_fingerprint=fp, seed=1, episodes=3), tmp_path / "root" / "s1")
    calls = []
    real = teacher_targets
    # patched where build_teacher_cache looks it up
    monkeypatch.setattr(TT, "teacher_targets", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    big_spec = spec(model_fingerprint=fp, episodes=12)
    big = TT.build_teacher_cache(model, tok, big_spec, tmp_path / "root" / "big")
    # shards 0 and 1 (episodes 0-5) come from the 8-episode cache; its last shard holds only 2 of
    # shard 2's 3 episodes, and the seed-1 cache holds other episodes: 6 episodes are computed
    assert len(calls) == 6
    assert (big / "shard-00000.safetensors").read_bytes() == (small / "shard-00000.safetensors").read_bytes()
    assert (big / "shard-00002.safetensors").read_bytes() != (small / "shard-00002.safetensors").read_bytes()
    monkeypatch.setattr(TT, "teacher_targets", real)
    fresh = TT.build_teacher_cache(model, tok, big_spec, tmp_path / "alone" / "big")
    a, b = TT.TeacherCache.open(big, big_spec), TT.TeacherCache.open(fresh, big_spec)
    for i in (0, 5, 6, 11):
        x, y = a.get(i), b.get(i)
        assert all(torch.allclose(x[n], y[n], atol=1e-5) for n in ("pool_k", "top_logp", "hidden", "gold_logp"))
    assert not list(big.glob("*.tmp")) and other.name == "s1"


def test_pool_kv_means_equal_chunks():
    kv = torch.arange(2 * 10 * 1, dtype=torch.float32).view(2, 10, 1)
    pooled = pool_kv(kv, 10, 2, 4)  # positions 2..9 in 4 chunks of 2
    assert pooled[0, :, 0].tolist() == [2.5, 4.5, 6.5, 8.5]
    with pytest.raises(ValueError, match="fewer than num_virtual=4"):
        pool_kv(kv, 5, 2, 4)


# --- training -----------------------------------------------------------------------------


def test_distill_trains_and_stage1_loss_decreases(tmp_cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["distill", *SMALL, "--stage1-epochs", "12", "--stage1-lr", "3e-3", "--out", str(out)]) == 0
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    stage1 = [h["kv"] for h in history if h["stage"] == 1]
    assert sum(stage1[-4:]) / 4 < sum(stage1[:4]) / 4 - 0.05
    assert any(h["stage"] == 2 and "kl" in h for h in history)
    assert json.loads((out / "distill_config.json").read_text())["k"] == 4
    assert not (out / "checkpoint").exists()
    mask = os.umask(0o022)
    os.umask(mask)
    for name in ("model.safetensors", "config.json", "distill_config.json", "history.jsonl"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~mask, name  # not owner-only
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".icl-ssm.lock"]  # no temporaries
    log = capsys.readouterr().err  # not a terminal: plain progress lines instead of bars
    assert re.search(r"teacher targets (\d+)/\1 episodes", log) and re.search(r"step (\d+)/\1 stage 2", log)
    # the same configuration again: nothing to do
    assert main(["distill", *SMALL, "--stage1-epochs", "12", "--stage1-lr", "3e-3", "--out", str(out)]) == 0
    assert "already trained" in capsys.readouterr().err
    # a run saved before a field existed reads as that field's default
    stored = json.loads((out / "distill_config.json").read_text())
    del stored["shared_tail"]
    (out / "distill_config.json").write_text(json.dumps(stored))
    assert main(["distill", *SMALL, "--stage1-epochs", "12", "--stage1-lr", "3e-3", "--out", str(out)]) == 0
    assert "already trained" in capsys.readouterr().err
    assert main(["distill", *SMALL, "--stage1-epochs", "12", "--stage1-lr", "3e-3", "--shared-tail", "1",
                 "--out", str(out)]) == 2
    assert "shared_tail: 0 there, 1 requested" in capsys.readouterr().err


def test_recipes_fill_the_flags_not_given(tmp_cache, tmp_path, capsys):
    measured, paper = DistillConfig(), DistillConfig.recipe("paper")
    assert (measured.num_recent, measured.gate, measured.lambda_rank, measured.stage2_lr) == (16, True, 1.0, 1e-3)
    assert (paper.num_recent, paper.gate, paper.lambda_rank, paper.stage2_lr, paper.stage2_epochs) == (
        0, False, 0.0, 5e-5, 1.0)
    assert (measured.system, paper.system) == ("scale_invariant", "time_invariant")
    assert DistillConfig.recipe("paper", stage2_lr=1e-4).stage2_lr == 1e-4  # explicit values win
    with pytest.raises(ValueError, match="recipe 'best': accepted: measured, paper"):
        DistillConfig.recipe("best")
    out = tmp_path / "paper"
    assert main(["distill", "--recipe", "paper", *SMALL, "--stage2-epochs", "0.5", "--out", str(out),
                 "--stop-after", "1"]) == 0
    stored = json.loads((out / "distill_config.json").read_text())
    assert (stored["num_recent"], stored["gate"], stored["stage2_lr"]) == (0, False, 5e-5)
    assert (stored["lambda_rank"], stored["stage2_epochs"]) == (1.0, 0.5)  # given on the command line
    with pytest.raises(SystemExit):
        main(["distill", "--recipe", "best", *SMALL, "--out", str(tmp_path / "x")])
    assert "invalid choice: 'best'" in capsys.readouterr().err
    # a run saved before num_recent and gate existed had neither: it reads as the paper recipe's values
    for key in ("num_recent", "gate"):
        del stored[key]
    (out / "distill_config.json").write_text(json.dumps(stored))
    assert main(["distill", *SMALL, "--stage2-epochs", "0.5", "--out", str(out), "--resume"]) == 2
    assert "num_recent: 0 there, 16 requested" in capsys.readouterr().err


def test_shipped_commands_reproduce_their_configs():
    """Each shipped compressor's command, parsed today, asks for the run it was trained with."""
    import shlex

    from icl_ssm.cli import build_parser
    from icl_ssm.cli.distill import config_from_args
    from icl_ssm.compress.pretrained import pretrained_root

    recipes = sorted(pretrained_root().glob("*/recipe.json"))
    assert recipes
    for path in recipes:
        recipe = json.loads(path.read_text())
        for key, control in (("command", False), ("control_command", True)):
            if key not in recipe:
                continue
            args = build_parser().parse_args(shlex.split(recipe[key])[1:])
            cfg = json.loads(json.dumps(dataclasses.asdict(config_from_args(args))))
            want = {**recipe["distill_config"], "control": control}
            assert {k: cfg[k] for k in want} == want, (path, key)


def test_resume_ends_with_the_same_weights(tmp_cache, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["distill", *SMALL, "--out", str(straight)]) == 0
    assert main(["distill", *SMALL, "--out", str(resumed), "--stop-after", "5"]) == 0
    assert (resumed / "checkpoint").exists() and not (resumed / "model.safetensors").exists()
    capsys.readouterr()
    assert main(["distill", *SMALL, "--out", str(resumed)]) == 0  # the same command continues it
    assert "continuing the unfinished run there from its last checkpoint" in capsys.readouterr().err
    assert same_weights(straight, resumed)
    assert main(["distill", *SMALL, "--out", str(tmp_path / "none"), "--resume"]) == 2  # nothing to continue
    assert "--resume: no checkpoint in" in capsys.readouterr().err


class Planted:
    """An object a pickle would rebuild by running code: what a checkpoint from someone else can hold."""

    def __reduce__(self):
        return (print, ("this ran while loading the checkpoint",))


def test_a_checkpoint_holding_a_pickled_object_is_refused_by_name(tmp_cache, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["distill", *SMALL, "--out", str(run), "--stop-after", "5"]) == 0
    state = run / "checkpoint" / "trainer_state.pt"
    saved = torch.load(state, weights_only=True)  # what icl-ssm writes loads without unpickling objects
    assert {"optimizer", "step", "history", "torch_rng"} <= set(saved)
    torch.save({**saved, "extra": Planted()}, state)
    capsys.readouterr()
    assert main(["distill", *SMALL, "--out", str(run), "--resume"]) == 2
    out = capsys.readouterr()
    assert f"{str(state)!r} holds objects other than tensors and plain values" in out.err
    assert "this ran while loading the checkpoint" not in out.out + out.err


def test_resumed_throughput_counts_only_the_steps_run_since_the_resume(tmp_cache, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(["distill", *SMALL, "--out", str(run), "--stop-after", "5"]) == 0  # checkpoint at step 4
    clock = iter(range(1000))  # one tick per reading: t0, then one reading per step
    fake_time = type("Clock", (), {"perf_counter": staticmethod(lambda: float(next(clock)))})
    monkeypatch.setattr(distill_train, "time", fake_time)
    capsys.readouterr()
    assert main(["distill", *SMALL, "--out", str(run), "--resume"]) == 0
    rates = re.findall(r"step (\d+)/\d+ .*\| ([\d.]+) steps/s", capsys.readouterr().err)
    assert rates and int(rates[0][0]) > 4
    assert all(float(rate) == 1.0 for _, rate in rates)  # counting steps from 0 would read (step+1)/(step-3)


def test_killed_process_resumes_to_the_same_weights(tmp_cache, tmp_path):
    args = [*SMALL, "--stage1-epochs", "40", "--checkpoint-every", "3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["distill", *args, "--out", str(straight)]) == 0
    env = {**os.environ, "ICL_SSM_CACHE": str(tmp_cache)}
    proc = subprocess.Popen([sys.executable, "-m", "icl_ssm", "distill", *args, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoint").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "model.safetensors").exists()
    assert main(["distill", *args, "--out", str(killed)]) == 0  # the same command continues the killed run
    assert same_weights(straight, killed)


def test_nan_loss_stops_and_keeps_the_last_checkpoint(tmp_cache, tmp_path, monkeypatch, capsys):
    real = group_losses
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        losses = real(*args, **kwargs)
        if calls["n"] > 5:
            losses["loss"] = losses["loss"] * float("nan")
        return losses

    monkeypatch.setattr(distill_train, "group_losses", poisoned)
    out = tmp_path / "run"
    assert main(["distill", *SMALL, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "at step 5" in err and "last good checkpoint" in err
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 4 and all(torch.isfinite(v).all() for v in weights(out / "checkpoint").values())


def test_bad_runs_are_refused(tmp_cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["distill", *SMALL, "--out", str(out), "--stop-after", "3"]) == 0
    assert main(["distill", *[a if a != "4" else "5" for a in SMALL], "--out", str(out)]) == 2
    assert "holds another run (k: 4 there, 5 requested" in capsys.readouterr().err
    ckpt = out / "checkpoint" / "model.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    assert main(["distill", *SMALL, "--out", str(out), "--resume"]) == 2
    assert "corrupted" in capsys.readouterr().err
    assert main(["distill", *SMALL, "--out", str(tmp_path / "fresh"), "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["distill", *SMALL, "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["distill", *SMALL[:-2], "--samples", "0", "--out", str(tmp_path / "z")]) == 2
    assert "samples must be a positive integer, got 0" in capsys.readouterr().err


def test_teacher_only_fills_the_cache_that_training_then_reads(tmp_cache, tmp_path, capsys):
    cache = tmp_path / "teacher"
    assert main(["distill", *SMALL, "--teacher-only", "--teacher-cache", str(cache)]) == 0
    log = capsys.readouterr().err
    assert "teacher cache complete" in log and re.search(r"teacher targets (\d+)/\1 episodes", log)
    shards = sorted(cache.glob("shard-*.safetensors"))
    assert shards and (cache / "meta.json").exists()
    stamps = [p.stat().st_mtime_ns for p in shards]
    assert main(["distill", *SMALL, "--teacher-cache", str(cache), "--out", str(tmp_path / "run")]) == 0
    assert [p.stat().st_mtime_ns for p in shards] == stamps  # read, not recomputed
    assert (tmp_path / "run" / "model.safetensors").exists()
    assert main(["distill", *SMALL]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_two_processes_train_like_one(tmp_cache, tmp_path):
    """``accelerate launch`` with 2 CPU processes (gloo) gives one process's weights."""
    args = [*SMALL, "--groups-per-step", "2", "--teacher-cache", str(tmp_path / "tc")]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["distill", *args, "--out", str(one)]) == 0
    env = {**os.environ, "ICL_SSM_CACHE": str(tmp_cache)}
    accelerate = Path(sys.executable).with_name("accelerate")
    result = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "-m", "icl_ssm",
                             "distill", *args, "--out", str(two)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert same_weights(one, two, atol=1e-6)
    h1 = [json.loads(x) for x in (one / "history.jsonl").read_text().splitlines()]
    h2 = [json.loads(x) for x in (two / "history.jsonl").read_text().splitlines()]
    assert [round(a["loss"], 5) for a in h1] == [round(b["loss"], 5) for b in h2]


def test_hybrid_targets_pool_only_what_the_recent_tokens_do_not_keep(tmp_cache):
    from icl_ssm.lm.prompts import PromptBuilder

    model, tok = load_model("tiny-llama")
    task = get_task("coin_flip", size=60)
    pool = split(task, seed=0).pool
    builder = PromptBuilder.for_model(model, tok, task)
    s = spec(num_recent=5)
    targets = teacher_targets(model, builder, pool[:4], pool[4:6], s)
    ids = torch.tensor([builder.build_prefix(pool[:4]).input_ids])
    keys = dense_cache(model, ids).keys
    L = ids.shape[1]
    torch.testing.assert_close(targets["pool_k"][1].float(), pool_kv(keys[1][0], L - 5, 2, 4), rtol=1e-3, atol=1e-3)


def test_label_kl_is_the_kl_of_the_renormalised_label_distribution():
    logp = torch.log_softmax(torch.randn(3, 10), -1)
    tokens = torch.tensor([[2, 5, -1], [2, 5, -1], [1, 4, 7]])
    teacher = logp.gather(1, tokens.clamp(min=0))
    assert label_kl(logp, tokens, teacher).abs().max() < 1e-6  # same distribution: 0
    other = teacher.clone()
    other[0, 0] += 2.0
    kl = label_kl(logp, tokens, other)
    t = torch.log_softmax(other[0, :2], -1)
    s = torch.log_softmax(logp[0, [2, 5]], -1)
    assert kl[0] == pytest.approx(float((t.exp() * (t - s)).sum()), abs=1e-6) and kl[0] > 0
    assert label_kl(logp, torch.full((3, 2), -1), teacher[:, :2]).abs().max() == 0  # no labels: 0


def test_distill_with_the_label_term_logs_it(tmp_cache, tmp_path):
    out = tmp_path / "run"
    assert main(["distill", *SMALL, "--lambda-label", "1.0", "--out", str(out)]) == 0
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert all(h["label"] >= 0 for h in history if h["stage"] == 2) and any("label" in h for h in history)


def test_gated_compressor_trains_its_gates_and_resumes(tmp_cache, tmp_path):
    gated = [*SMALL, "--num-recent", "2", "--gate", "--gate-init", "-3.0", "--gate-lr", "0.2",
             "--stage2-epochs", "2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["distill", *gated, "--out", str(straight)]) == 0
    gate = weights(straight)["gate_bias"]
    assert gate.shape == (4,) and (gate != -3.0).all()  # stage 2 moved every gate, at the gates' own rate
    assert (gate + 3.0).abs().max() > 0.1
    history = [json.loads(line) for line in (straight / "history.jsonl").read_text().splitlines()]
    assert history[-1]["gate_mean"] == pytest.approx(gate.mean().item(), abs=1e-6)
    assert main(["distill", *gated, "--out", str(resumed), "--stop-after", "9"]) == 0
    assert main(["distill", *gated, "--out", str(resumed), "--resume"]) == 0
    assert same_weights(straight, resumed)


def test_learned_dt_trains_resumes_and_loads(tmp_cache, tmp_path, capsys):
    from icl_ssm.compress.compressor import load_compressor

    learned = [*SMALL, "--system", "time_invariant", "--learn-dt", "--dt", "0.01", "--dt-lr", "0.1"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["distill", *learned, "--out", str(straight)]) == 0
    log_dt = weights(straight)["ssm.log_dt"]
    assert log_dt.shape == (2,) and (log_dt - torch.tensor(0.01).log()).abs().max() > 0.05  # at its own rate
    history = [json.loads(line) for line in (straight / "history.jsonl").read_text().splitlines()]
    assert history[-1]["dt"] == pytest.approx(log_dt.exp().tolist(), rel=1e-5)
    assert main(["distill", *learned, "--out", str(resumed), "--stop-after", "5"]) == 0
    assert main(["distill", *learned, "--out", str(resumed), "--resume"]) == 0
    assert same_weights(straight, resumed)
    model, _ = load_model("tiny-llama")
    c = load_compressor(straight, model.config)
    assert c.config.learn_dt and torch.equal(c.ssm.log_dt.detach(), log_dt)
    x = torch.randn(2, 9, c.config.teacher_hidden_size)
    c.ssm.impl = "reference"
    ref = c.states(x)
    c.ssm.impl = "fast"
    assert torch.allclose(c.states(x), ref, atol=1e-4)
    # the measured recipe's system is scale-invariant: --learn-dt alone is refused, saying what to add
    assert main(["distill", *SMALL, "--learn-dt", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "learn_dt needs system='time_invariant'" in err and "--system time_invariant" in err
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_standardized_channels_train_resume_and_load(tmp_cache, tmp_path):
    from icl_ssm.compress.compressor import SSMCompressor, load_compressor
    from icl_ssm.distill.run import teacher_spec

    flags = [*SMALL, "--system", "scale_invariant", "--channels", "4", "--standardize"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["distill", *flags, "--out", str(straight)]) == 0
    assert main(["distill", *flags, "--out", str(resumed), "--stop-after", "5"]) == 0
    assert main(["distill", *flags, "--out", str(resumed), "--resume"]) == 0
    assert same_weights(straight, resumed)  # the statistics travel with the checkpoint
    w = weights(straight)
    model, tok = load_model("tiny-llama")
    c = load_compressor(straight, model.config)
    assert c.config.standardize and c.ssm.channels == 4
    assert torch.equal(c.state_std, w["state_std"]) and torch.equal(c.state_mean, w["state_mean"])
    # they are the untrained SSM's mean and std over the training prompts
    cfg = DistillConfig(**json.loads((straight / "distill_config.json").read_text()))
    spec = teacher_spec(cfg, model, tok)
    teacher = TT.TeacherCache.open(TT.build_teacher_cache(model, tok, spec), spec)
    torch.manual_seed(cfg.seed)
    fresh = SSMCompressor(c.config)
    states = training_states(model, fresh, teacher)
    assert states.shape == (cfg.samples, *w["state_mean"].shape)
    torch.testing.assert_close(w["state_mean"], states.double().mean(0).float())
    torch.testing.assert_close(w["state_std"], states.double().std(0).float())
    # the head reads standardised states: the same weights without the buffers, fed
    # (states - mean) / std, give the same virtual tokens
    config = copy.deepcopy(c.config)
    config.standardize = False
    plain = SSMCompressor(config)
    plain.load_state_dict({k: v for k, v in c.state_dict().items() if k not in ("state_mean", "state_std")})
    x = states[:3]
    want = plain.head((x - c.state_mean) / c.state_std)
    torch.testing.assert_close(c.head(x).keys, want.keys)
    torch.testing.assert_close(c.head(x).values, want.values)
    assert not torch.allclose(plain.head(x).keys, want.keys)


def test_fit_standardizer_refusals():
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig

    plain = SSMCompressor(SSMCompressorConfig(state_size=8, num_groups=2))
    with pytest.raises(ValueError, match="standardize=False"):
        plain.fit_standardizer(torch.randn(4, 2, 8))
    c = SSMCompressor(SSMCompressorConfig(state_size=8, num_groups=2, standardize=True))
    with pytest.raises(ValueError, match=r"states must be \(n >= 2, 2, 8\), got \(1, 2, 8\)"):
        c.fit_standardizer(torch.randn(1, 2, 8))
    states = torch.randn(50, 2, 8) * 3 + 5
    c.fit_standardizer(states)
    z = (states - c.state_mean) / c.state_std
    torch.testing.assert_close(z.mean(0), torch.zeros(2, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0), torch.ones(2, 8), atol=1e-5, rtol=0)


def test_numeric_answers_are_scored_where_they_differ(tmp_cache, tmp_path):
    """modular_addition writes " 12" as ' ', '1', '2': the targets sit after the shared space."""
    model, tok = load_model("tiny-llama")
    builders, pools = TT.task_builders(model, tok, ("modular_addition",), seed=0, chat=False)
    leads = TT.answer_leads(builders, pools)
    assert leads == ((tok.convert_tokens_to_ids("Ġ"),),)
    assert TT.answer_leads(*TT.task_builders(model, tok, ("coin_flip",), seed=0, chat=False)) == ()
    base = dict(model_fingerprint=SP.model_fingerprint(model), tasks=("modular_addition",), episodes=3)
    with pytest.raises(ValueError, match="answer_leads is \\(\\), but the answers of \\['modular_addition'\\]"):
        TT.build_teacher_cache(model, tok, spec(**base), tmp_path / "bad")
    s = spec(**base, answer_leads=leads)
    assert s.key() != spec(**base).key()
    d = TT.build_teacher_cache(model, tok, s, tmp_path / "tc")
    e = TT.TeacherCache.open(d, s).get(0)
    builder, pool = builders[0], pools[0]
    queries = [pool[i] for i in TT.TeacherCache.open(d).episodes[0].queries]
    for q, ids, gold in zip(queries, e["query_ids"], e["gold_token"], strict=True):
        assert ids.tolist() == builder.build_suffix(q).input_ids + list(leads[0])
        assert int(gold) == builder.answer_ids(q)[1] and tok.convert_ids_to_tokens(int(gold)).isdigit()
    label_tokens = [t for t in e["label_tokens"].tolist() if t >= 0]
    assert sorted(tok.convert_ids_to_tokens(label_tokens)) == [str(i) for i in range(10)]  # distinct digits
    assert TT.TeacherCache.open(d).spec == s  # the stored leads read back as the spec's
    with pytest.raises(ValueError, match="answer_leads has 2 entries for 1 tasks"):
        spec(answer_leads=((1,), (2,)))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_packed_teacher_pass_gives_the_reference_targets(name, tmp_cache):
    from icl_ssm.lm.prompts import PromptBuilder

    model, tok = load_model(name)
    task = get_task("coin_flip", size=60)
    pool = split(task, seed=0).pool
    builder = PromptBuilder.for_model(model, tok, task)
    lead = builder.answer_lead(pool[4:9])
    s = spec(num_recent=3)
    packed = teacher_targets(model, builder, pool[:4], pool[4:9], s, lead)  # 5 queries of different lengths
    reference = teacher_targets(model, builder, pool[:4], pool[4:9], s, lead, pack=False)
    assert len({len(q) for q in packed["query_ids"]}) > 1
    assert set(packed) == set(reference)
    for name_, value in reference.items():
        if name_ == "query_ids":
            assert [q.tolist() for q in packed[name_]] == [q.tolist() for q in value]
        elif value.is_floating_point():
            torch.testing.assert_close(packed[name_].float(), value.float(), rtol=1e-3, atol=2e-3)
        elif name_ != "top_idx":  # ties among the tail of the top 64 may swap under rounding
            assert torch.equal(packed[name_], value), name_
    assert torch.equal(packed["top_idx"][:, :8], reference["top_idx"][:, :8])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in __import__("icl_ssm.compress.pretrained", fromlist=["x"])
                                        .pretrained_root().iterdir() if (p / "recipe.json").exists()))
def test_every_shipped_compressor_keeps_the_fidelity_its_recipe_records(name):
    """On a small sample of its held-out subsets (4 subsets x 8 queries of the recorded 30 x 32),
    each shipped compressor answers close to the dense prompt as its recipe says it does: the
    weights load, serve the embedded model and were not swapped or damaged."""
    from icl_ssm.compress.pretrained import pretrained_root
    from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity

    root = pretrained_root() / name
    recipe = json.loads((root / "recipe.json").read_text())
    recorded = recipe["fidelity"]
    report = run_fidelity(FidelityConfig(model=recipe["model"], task=recipe["tasks"][0], k=recipe["k"],
                                         compressor=str(root / "compressor"), subsets=4, queries=8,
                                         seed=recorded["seed"]))
    assert report["cache_tokens"] == recorded["cache_tokens"]
    assert report["kl"] < 2 * recorded["kl"] + 0.02, (report["kl"], recorded["kl"])
    assert report["rel_logit_err"] < 1.5 * recorded["rel_logit_err"] + 0.05
    assert report["top1_agree"] > recorded["top1_agree"] - 0.3  # 32 answers: a coarse check
    assert report["flops_compressed"] < report["flops_dense"]


def test_init_from_starts_from_another_tasks_compressor_and_runs_stage_2_only(tmp_cache, tmp_path, capsys):
    from icl_ssm.compress.compressor import load_compressor

    source = tmp_path / "source"
    assert main(["distill", *SMALL, "--out", str(source)]) == 0
    other = [("modular_addition" if a == "coin_flip" else a) for a in SMALL]  # another task, same teacher
    target = tmp_path / "target"
    assert main(["distill", *other, "--init-from", str(source), "--out", str(target)]) == 0
    history = [json.loads(line) for line in (target / "history.jsonl").read_text().splitlines()]
    assert history and {h["stage"] for h in history} == {2}  # no KV alignment: the weights come from source
    fresh = tmp_path / "fresh"
    assert main(["distill", *other, "--stage1-epochs", "0", "--out", str(fresh)]) == 0
    a, b = load_compressor(target).state_dict(), load_compressor(fresh).state_dict()
    assert any(not torch.equal(a[n], b[n]) for n in a)  # the same stage 2 from other weights ends elsewhere
    capsys.readouterr()
    assert main(["distill", *other, "--num-virtual", "2", "--init-from", str(source), "--out",
                 str(tmp_path / "bad")]) == 2
    assert "is a compressor of another shape (num_virtual: 4 there, 2 here)" in capsys.readouterr().err


def test_a_second_distill_on_the_same_out_is_refused_and_a_killed_start_does_not_block(tmp_cache, tmp_path, capsys):
    from icl_ssm.lock import LOCK, one_writer

    out = tmp_path / "run"
    out.mkdir()
    with one_writer(out, "icl-ssm distill"):
        assert main(["distill", *SMALL, "--out", str(out)]) == 2
    assert "is being written by another icl-ssm process" in capsys.readouterr().err
    (out / LOCK).write_text('{"pid": 999999, "command": "icl-ssm distill", "started": 0}\n')  # a killed start
    (out / ".distill_config.json.x1.tmp").write_text("{")
    assert main(["distill", *SMALL, "--out", str(out), "--stop-after", "2"]) == 0
    assert not (out / ".distill_config.json.x1.tmp").exists() and (out / "checkpoint").is_dir()
