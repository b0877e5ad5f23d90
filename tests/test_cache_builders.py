"""The cache builders (icl_ssm.compress.builders): one class per file, each the cache function it
wraps, the transformer tokens it reads, and the one place a cache is chosen by name."""

import ast
import pathlib
from dataclasses import replace

import pytest
import torch

from icl_ssm.compress import builders
from icl_ssm.compress.baselines import lm_infinite_cache, streaming_cache
from icl_ssm.compress.builders import (
    CACHES,
    CacheBuilder,
    CompressedCache,
    ControlCache,
    DenseCache,
    LMInfiniteCache,
    StreamingCache,
    WindowCache,
    cache_for,
)
from icl_ssm.compress.cache import compressed_cache, dense_cache, window_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.evaluate.answers import pad_right
from icl_ssm.lm.tiny import tiny_model

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "icl_ssm"


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = SSMCompressorConfig.for_teacher(model.config, state_size=16, num_virtual=4, num_sink=2,
                                                 latent_size=8, num_recent=3)
        comp = SSMCompressor(config).eval()
        control = SSMCompressor(replace(config, control=True)).eval()
    ids, mask = pad_right([list(range(5, 25)), list(range(7, 19))])  # (2, 20): rows of 20 and 12 tokens
    return model, comp, control, ids, mask


def _same(a, b):
    assert torch.equal(a.mask, b.mask) and torch.equal(a.next_position, b.next_position)
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
        torch.testing.assert_close(x, y)


def test_every_builder_is_the_cache_function_it_wraps_and_counts_the_tokens_it_reads(setup):
    model, comp, control, ids, mask = setup
    real = int(mask.sum())
    cases = [
        (DenseCache(model), dense_cache(model, ids, mask), real),
        (CompressedCache(model, comp), compressed_cache(model, comp, ids, mask), 2 * (2 + 3)),
        (ControlCache(model, control), compressed_cache(model, control, ids, mask), 2 * (2 + 3)),
        (WindowCache(model, 2, 5), window_cache(model, ids, mask, 2, 5, "compressed"), 2 * (2 + 5)),
        (StreamingCache(model, 2, 5), streaming_cache(model, ids, mask, 2, 5), real),
        (LMInfiniteCache(model, 2, 5), lm_infinite_cache(model, ids, mask, 2, 5), real),
    ]
    with torch.no_grad():
        for built, reference, tokens in cases:
            assert isinstance(built, CacheBuilder)
            _same(built(ids, mask), reference)
            assert built.tokens(mask) == tokens, built.name
    assert [b.name for b, _, _ in cases] == ["dense", "compressed", "control", "window", "streaming", "lm-infinite"]
    like = WindowCache.like(model, comp)
    assert (like.num_sink, like.n_window, like.position) == (2, 4 + 3, comp.config.position)


def test_a_cache_is_chosen_by_name_in_one_place_and_bad_input_is_refused(setup):
    model, comp, control, _, _ = setup
    assert CACHES == ("dense", "compressed")
    assert isinstance(cache_for("dense", model), DenseCache) and isinstance(cache_for("exact", model), DenseCache)
    assert cache_for("compressed", model, comp) == CompressedCache(model, comp)
    with pytest.raises(ValueError, match="cache 'compressed' needs a compressor"):
        cache_for("compressed", model)
    with pytest.raises(ValueError, match="cache 'full'; accepted: dense, compressed"):
        cache_for("full", model)
    with pytest.raises(ValueError, match="not a control"):
        ControlCache(model, comp)
    with pytest.raises(ValueError, match="n_window=-1"):
        WindowCache(model, 2, -1)


def test_one_builder_class_per_file_and_no_cache_named_by_a_string_where_caches_are_used():
    """Each file of the builders package holds one CacheBuilder class; the stages that use caches
    (evaluate, select, apply, pipeline) build none by calling the cache functions themselves."""
    folder = pathlib.Path(builders.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name in ("__init__.py", "base.py"):
            continue
        classes = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
        assert len(classes) == 1, (path.name, classes)
        assert isinstance(getattr(builders, classes[0]), type)
    assert len(builders.__all__) == 2 + 1 + 6  # CACHES, cache_for, the protocol and six builders
    banned = {"dense_cache", "compressed_cache", "window_cache", "streaming_cache", "lm_infinite_cache"}
    for stage in ("evaluate", "select", "apply", "pipeline"):
        for path in sorted((SRC / stage).glob("*.py")):
            calls = {n.func.id for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            assert not calls & banned, (path.relative_to(SRC), sorted(calls & banned))


def test_the_compressor_shape_is_declared_once():
    """Its fields and their two presets live in icl_ssm.compress.shape; the model config defaults
    to the paper's, distill and run to the measured recipe, and none of them writes a literal."""
    from icl_ssm.compress.shape import COMPRESSOR_FIELDS, PAPER, RECIPE, CompressorShape
    from icl_ssm.distill.config import DistillConfig
    from icl_ssm.pipeline.config import RunConfig

    model_default = SSMCompressorConfig()
    assert {n: getattr(model_default, n) for n in COMPRESSOR_FIELDS} == {**PAPER.__dict__, "num_groups": 4}
    assert DistillConfig().shape == RECIPE and DistillConfig.recipe("paper").shape == PAPER
    assert PAPER != RECIPE and RECIPE == CompressorShape()
    run = RunConfig()
    shared = [n for n in COMPRESSOR_FIELDS if hasattr(run, n) and n != "control"]  # run's control: a directory
    assert len(shared) == 6 and all(getattr(run, n) == getattr(RECIPE, n) for n in shared)
    for path, cls in (("compress/compressor.py", "SSMCompressorConfig"), ("distill/config.py", "DistillConfig"),
                      ("pipeline/config.py", "RunConfig")):
        [body] = [n.body for n in ast.parse((SRC / path).read_text()).body
                  if isinstance(n, ast.ClassDef) and n.name == cls]
        literal = [n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                   and n.target.id in COMPRESSOR_FIELDS and isinstance(n.value, ast.Constant)]
        expected = {"SSMCompressorConfig": ["num_groups"], "RunConfig": ["control"]}.get(cls, [])
        assert literal == expected, (cls, literal)
