"""The user's own data when it is small or messy: splits sized to a small file, a warning
when the labels leave nothing to select, rows with an empty text skipped on request."""

import argparse
import itertools
import json

import pytest

from icl_ssm.cli import data as data_cli
from icl_ssm.data.splits import (
    SplitSizes,
    fit_split_sizes,
    label_warning,
    pool_minimum,
    split,
)
from icl_ssm.data.tasks import Example, get_task, normalize_text


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def small_file(tmp_path):
    """60 rows, two labels: too few for the default splits of `icl-ssm select` (32 queries)."""
    rows = [{"text": f"review {i}: it was {'great' if i % 2 else 'dull'}", "label": "pos" if i % 2 else "neg"}
            for i in range(60)]
    return write_jsonl(tmp_path / "small.jsonl", rows)


# ---------------------------------------------------------------------------------
# splits sized to a small file
# ---------------------------------------------------------------------------------


def test_small_file_fails_without_fit_and_fits_with_it(small_file):
    task = get_task(str(small_file))
    plain = split(task, pool_size=1500, seed=0)
    assert len(plain.validation) == 6 < 32  # select's 32 queries: "ask for at most 6"
    assert plain.note is None
    fitted = split(task, pool_size=1500, seed=0, fit=True, k=20, min_val_size=32)
    assert (len(fitted.pool), len(fitted.validation), len(fitted.test)) == (30, 20, 10)
    assert fitted.note == (
        f"{small_file}: 60 distinct examples, too few for the splits asked (pool 1500, validation 32 to serve "
        "32 queries, test 15); using pool 30, validation 20, test 10: shrunk in proportion, keeping a pool of 30 "
        "(k=20 + 10) to choose from"
    )
    parts = [fitted.pool, fitted.validation, fitted.test]
    for a, b in itertools.combinations(parts, 2):
        assert not {e.id for e in a} & {e.id for e in b}
    assert split(task, pool_size=1500, seed=0, fit=True, k=20, min_val_size=32) == fitted
    # `icl-ssm run`'s sizes (pool 100, 8 queries): the queries are served, nothing else lost
    run = split(task, pool_size=100, seed=0, fit=True, k=20, min_val_size=8)
    assert (len(run.pool), len(run.validation), len(run.test)) == (38, 8, 14)


def test_fit_changes_nothing_where_the_sizes_fit():
    examples = [Example(f"e{i}", f"text {i}", "ab"[i % 2]) for i in range(400)]
    plain = split(examples, pool_size=150, seed=3)
    fitted = split(examples, pool_size=150, seed=3, fit=True, k=20, min_val_size=32)
    assert fitted == plain and fitted.note is None
    assert fit_split_sizes(10662, pool_size=1500, k=50, min_validation=32) == (SplitSizes(1500, 100, 500), None)


def test_fit_notes_a_raised_validation_and_a_short_pool():
    sizes, note = fit_split_sizes(3000, pool_size=1500, k=20, min_validation=200, name="big.jsonl")
    assert sizes == SplitSizes(pool=1500, validation=200, test=500)
    assert note == ("big.jsonl: 3000 distinct examples; using pool 1500, validation 200, test 500: validation "
                    "raised from the default 100 to serve 200 queries")
    sizes, note = fit_split_sizes(1000, pool_size=1500, k=20, min_validation=32, name="mid.jsonl")
    assert sizes == SplitSizes(pool=650, validation=100, test=250)  # what split gives without fit
    assert note == ("mid.jsonl: 1000 distinct examples; using pool 650, validation 100, test 250: pool 650 of the "
                    "1500 asked")


@pytest.mark.parametrize(("n", "k", "queries"), list(itertools.product([8, 13, 30, 60, 200, 900], [1, 4, 20], [8, 32])))
def test_fitted_sizes_keep_their_minimums(n, k, queries):
    try:
        sizes, note = fit_split_sizes(n, pool_size=1500, k=k, min_validation=queries)
    except ValueError as err:
        assert n < pool_minimum(k) + 2 and f"{n} distinct examples" in str(err)
        return
    assert sum(sizes) <= n
    assert sizes.pool >= pool_minimum(k) and sizes.validation >= 1 and sizes.test >= 1
    if sizes.validation < queries:
        assert note is not None and "shrunk in proportion" in note


def test_fit_refuses_what_cannot_fit(small_file):
    with pytest.raises(ValueError) as err:
        fit_split_sizes(7, pool_size=1500, k=4, name="tiny.jsonl")
    assert str(err.value) == (
        "tiny.jsonl: 7 distinct examples, too few to split for k=4: at least 8 are needed (a pool of 6 = k + 2 "
        "to choose from, 1 validation and 1 test example); add examples or lower k"
    )
    with pytest.raises(ValueError, match=f"{small_file}: 60 distinct examples, too few to split for k=40: at least 62"):
        split(get_task(str(small_file)), fit=True, k=40)
    with pytest.raises(ValueError, match="pool_size=10 is smaller than k=20; ask for a pool of at least 30"):
        fit_split_sizes(60, pool_size=10, k=20)


def test_fit_note_counts_repeated_texts(tmp_path):
    rows = [{"text": f"t{i}", "label": "ab"[i % 2]} for i in range(40)] + [{"text": "T0!", "label": "a"}]
    task = get_task(str(write_jsonl(tmp_path / "rep.jsonl", rows)))
    s = split(task, fit=True, k=4, min_val_size=8)
    assert "40 distinct examples" in s.note and s.note.endswith(
        "(1 of the 41 examples repeat an earlier text and are dropped)")


# ---------------------------------------------------------------------------------
# labels that leave nothing to select
# ---------------------------------------------------------------------------------


def _pool(counts):
    return [Example(f"{label}{i}", f"{label} {i}", label) for label, n in counts.items() for i in range(n)]


def test_label_warning():
    assert label_warning(_pool({"neg": 30, "pos": 30})) is None
    one = label_warning(_pool({"pos": 60}))
    assert one.startswith("all 60 examples have the label 'pos'") and "nothing to select" in one
    rare = label_warning(_pool({"neg": 2, "pos": 58}))
    assert rare.startswith("label 'neg' has fewer than 5% of the 60 examples (label counts: 'pos' 58, 'neg' 2)")
    absent = label_warning(_pool({"neg": 30, "pos": 30}), labels=("neg", "neutral", "pos"))
    assert absent.startswith("label 'neutral' has fewer than 5%") and "'neutral' 0" in absent
    assert label_warning(_pool({"pos": 60}), labels=()) is None  # a generative task: answers are not labels
    assert label_warning([]) is None


def test_one_label_file_warns(tmp_path):
    task = get_task(str(write_jsonl(tmp_path / "one.jsonl", [{"text": f"t{i}", "label": "pos"} for i in range(50)])))
    s = split(task, fit=True, k=4, min_val_size=8)
    assert "the label 'pos'" in label_warning(s.pool, task.labels)


# ---------------------------------------------------------------------------------
# rows with an empty text
# ---------------------------------------------------------------------------------

MESSY = [
    {"text": "good", "label": "pos"},
    {"text": "bad", "label": "neg"},
    {"text": "", "label": "neg"},  # line 3
    {"text": "fine", "label": None},  # line 4
    {"text": "   ", "label": "pos"},  # line 5
    {"text": "Good!", "label": "neg"},  # line 6: repeats line 1, another label
    {"text": "ok", "label": "pos"},
]


def test_empty_text_refused_with_how_to_skip(tmp_path):
    path = write_jsonl(tmp_path / "messy.jsonl", MESSY)
    with pytest.raises(ValueError) as err:
        get_task(str(path))
    assert str(err.value) == (
        f"{path} line 3: field 'text' is ''; expected a non-empty string or number; pass skip_empty=true / "
        "--skip-empty to skip rows with an empty text or label"
    )


@pytest.mark.parametrize("flag", [True, "true", 1])
def test_skip_empty_skips_and_reports_lines(tmp_path, flag):
    path = write_jsonl(tmp_path / "messy.jsonl", MESSY)
    task = get_task(str(path), skip_empty=flag)
    assert [e.id for e in task.examples()] == ["line-1", "line-2", "line-6", "line-7"]
    assert task.notes() == [
        f"{path}: skipped 2 rows with an empty text (lines 3, 5) and 1 row with an empty label (line 4)",
        f"{path}: 1 row repeats the text of an earlier row (line 6); the splits keep only the first; 1 of them "
        "with another label than the first (line 6)",
    ]
    pool = split(task, pool_size=10, val_size=0, test_size=0).pool
    assert sorted(normalize_text(e.input) for e in pool) == ["bad", "good", "ok"]  # line 6 repeats line 1


def test_skip_empty_csv_many_lines_and_all_empty(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("text,label\n" + "".join(f"t{i},a\n,b\n" for i in range(12)))
    task = get_task(str(path), skip_empty=True)
    assert len(task.examples()) == 12
    assert task.notes() == [f"{path}: skipped 12 rows with an empty text (lines 3, 5, 7, 9, 11, 13, 15, 17, 19, 21 "
                            "... and 2 more)"]
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": "", "label": "a"}, {"text": "x", "label": " "}])
    with pytest.raises(ValueError, match=f"{empty}: all 2 rows have an empty text or label"):
        get_task(str(empty), skip_empty=True)
    with pytest.raises(ValueError, match="skip_empty='maybe': expected true or false"):
        get_task(str(empty), skip_empty="maybe")
    with pytest.raises(ValueError, match="unknown option"):
        get_task("coin_flip", skip_empty=True)  # only the user's files have empty rows to skip


def run_data(argv, capsys):
    parser = argparse.ArgumentParser(prog="icl-ssm")
    data_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *argv])
    return args.func(args), capsys.readouterr()


def test_data_show_skip_empty_and_warnings(tmp_path, capsys):
    path = write_jsonl(tmp_path / "messy.jsonl", MESSY)
    for flags in (["--skip-empty"], ["-o", "skip_empty=true"]):
        code, out = run_data(["show", str(path), "--n", "2", *flags], capsys)
        assert code == 0 and "Output: " in out.out
        assert f"icl-ssm data: {path}: skipped 2 rows with an empty text (lines 3, 5)" in out.err
    one = write_jsonl(tmp_path / "one.jsonl", [{"text": f"t{i}", "label": "pos"} for i in range(5)])
    code, out = run_data(["show", str(one)], capsys)
    assert code == 0 and "icl-ssm data: warning: all 5 examples have the label 'pos'" in out.err


def test_select_and_distill_take_the_task_options(tmp_path, capsys):
    """`--skip-empty` and `-o` reach the task in every subcommand that loads one."""
    from icl_ssm.cli import build_parser, main
    from icl_ssm.cli.distill import config_from_args

    rows = [{"text": f"review {i}: it was {'great' if i % 2 else 'dull'}", "label": "pos" if i % 2 else "neg"}
            for i in range(40)] + [{"text": "", "label": "pos"}]
    path = write_jsonl(tmp_path / "messy.jsonl", rows)
    argv = ["select", "--model", "tiny-llama", "--task", str(path), "--method", "random", "--k", "2",
            "--queries", "2", "--test-size", "4"]
    assert main(argv) == 2
    assert "line 41: field 'text' is ''" in capsys.readouterr().err
    assert main([*argv, "--skip-empty"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2  # the two chosen demonstrations
    args = build_parser().parse_args(["distill", "--task", str(path), "a", "--skip-empty", "-o", "label_field=y"])
    assert config_from_args(args).task_options == {name: {"skip_empty": True, "label_field": "y"}
                                                   for name in (str(path), "a")}
    args = build_parser().parse_args(["run", "--task", str(path), "--skip-empty"])
    assert args.option == [] and args.skip_empty


# ---------------------------------------------------------------------- seven answers made precise

def test_seven_bad_inputs_get_a_precise_answer(tmp_path):
    from icl_ssm.compress.compressor import check_compressor_dir
    from icl_ssm.compress.pretrained import find_pretrained
    from icl_ssm.select.config import SelectConfig

    twice = tmp_path / "twice.csv"
    twice.write_text("text,label,label\na,x,y\n")
    with pytest.raises(ValueError, match=r"line 1: column 'label' appears more than once in the header"):
        get_task(str(twice))
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": NaN}\n')
    with pytest.raises(ValueError, match=r"nan.jsonl line 2: field 'label' is NaN"):
        get_task(str(nan))
    folder = tmp_path / "x.jsonl"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"x.jsonl: is a directory; expected a .jsonl file"):
        get_task(str(folder))
    with pytest.raises(ValueError, match=r"a .json file is not read as a task; save it as JSON Lines"):
        get_task(str(tmp_path / "x.json"))
    semi = tmp_path / "semi.csv"
    semi.write_text("text;label\na;x\n")
    with pytest.raises(ValueError, match=r"looks semicolon-separated, but a .csv file is read comma-separated"):
        get_task(str(semi))
    for k in (-3, 0):
        with pytest.raises(ValueError, match=rf"--k {k}: expected >= 1 demonstrations"):
            SelectConfig(k=k, method="random").validate()
    shipped = find_pretrained("smollm2-135m", "rotten_tomatoes", 20)
    with pytest.raises(ValueError, match=r"has no config.json; it holds compressors in .*compressor'.*: pass "):
        check_compressor_dir(shipped)


def test_schema_errors_name_the_file_the_key_the_value_and_what_is_accepted(tmp_path):
    from icl_ssm import schema

    spec = schema.record({"k": schema.POSITIVE, "name": schema.STRING, "pool": schema.nullable(schema.record(
        {"size": schema.POSITIVE}, required=("size",), closed=True))}, required=("k",), closed=True)
    path = tmp_path / "x.json"
    cases = {'{"k": 0}': "x.json: k is 0; expected a number >= 1",
             '{"k": "3"}': 'k is "3"; expected an integer',
             '{"k": true}': "k is true; expected an integer",
             '{"name": "a"}': "missing 'k'",
             '{"k": 1, "nmae": "a"}': "unknown key 'nmae'; accepted: k, name, pool",
             '{"k": 1, "pool": {"size": -1}}': "pool.size is -1; expected a number >= 1",
             '{"k": 1, "pool": 5}': "pool is 5; expected an object or a null",
             '[1, 2]': "the top level is [1, 2]; expected an object",
             '{"k": 1': "not valid JSON"}
    for text, expected in cases.items():
        path.write_text(text)
        with pytest.raises(ValueError) as err:
            schema.load(path, spec)
        assert expected in str(err.value) and str(path) in str(err.value), (text, str(err.value))
    path.write_bytes(b'{"k": 1, "name": "\xff"}')
    with pytest.raises(ValueError, match="not UTF-8"):
        schema.load(path, spec)
    path.write_text('{"k": 2, "pool": null}')
    assert schema.load(path, spec) == {"k": 2, "pool": None}


def test_a_selection_json_with_an_unknown_key_or_a_wrong_type_is_refused_before_use(tmp_path):
    from icl_ssm import SelectedPrompt
    from icl_ssm.data.splits import split
    from icl_ssm.data.tasks import get_task

    task = get_task("coin_flip", size=40)
    pool = split(task, pool_size=10, seed=0).pool
    folder = tmp_path / "sel"
    SelectedPrompt.from_pool(pool, [1, 2], model="tiny-llama", task=task, method="random").save(folder)
    data = json.loads((folder / "selection.json").read_text())
    assert SelectedPrompt.load(folder).k == 2
    for change, expected in (({"chat": "yes"}, 'chat is "yes"; expected a boolean'),
                             ({"pool": {"size": 0, "seed": 0}}, "pool.size is 0"),
                             ({"demonstrations": [{"id": 1, "text": "t", "label": "x"}]},
                              "demonstrations[0].id is 1; expected a string"),
                             ({"evil": 1}, "unknown key 'evil'")):
        (folder / "selection.json").write_text(json.dumps({**data, **change}))
        with pytest.raises(ValueError) as err:
            SelectedPrompt.load(folder)
        assert expected in str(err.value) and "selection.json" in str(err.value), str(err.value)


def test_a_compressor_config_with_a_misspelt_or_mistyped_field_is_refused_naming_it(tmp_path):
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor

    folder = tmp_path / "comp"
    SSMCompressor(SSMCompressorConfig(state_size=8, num_virtual=2, num_sink=1, latent_size=4)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert load_compressor(folder) is not None
    for change, expected in (({"stat_size": 8}, "unknown key 'stat_size'"),
                             ({"state_size": "8"}, 'state_size is "8"; expected an integer'),
                             ({"model_type": "llama"}, "model_type is \"llama\"; expected 'icl_ssm_compressor'")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError) as err:
            load_compressor(folder)
        assert expected in str(err.value) and "config.json" in str(err.value), str(err.value)


def test_no_path_in_the_package_unpickles_a_file():
    """Weights through safetensors, training state with ``weights_only=True``: no source file of
    the package calls a loader that can run code from a file someone sent."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "icl_ssm"
    risky = ("weights_only=False", "pickle.load(", "pickle.loads(", "allow_pickle=True", "dill.load", "joblib.load")
    found = [f"{p.relative_to(src)}: {r}" for p in src.rglob("*.py") for r in risky if r in p.read_text()]
    assert found == []
    loads = [p.relative_to(src) for p in src.rglob("*.py") if "torch.load(" in p.read_text()]
    assert all("weights_only=True" in (src / p).read_text() for p in loads), loads
