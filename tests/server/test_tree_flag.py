"""`elpis serve --tree` / `--chain`: the speculation shape they ask for (trees by default on exl3 with a
DFlash2 draft), their refusals, the exl3 load options, and a reference-backend server that builds token trees
and serves exactly what plain decoding serves."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from elpis.cli import main
from elpis.server import cli
from elpis.spec.generate import DEFAULT_DRAFT_TOP_K

from .conftest import running_server


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_speculation_shape():
    assert cli.speculation_shape(serve_args()) == (8, 1)  # chains by default
    assert cli.speculation_shape(serve_args("--tree-budget", "5")) == (5, 1)
    assert cli.speculation_shape(serve_args("--tree")) == (16, DEFAULT_DRAFT_TOP_K)
    assert cli.speculation_shape(serve_args("--tree", "--tree-budget", "8")) == (8, DEFAULT_DRAFT_TOP_K)


@pytest.mark.parametrize(
    ("argv", "tree"),
    [
        (["--backend", "exl3", "--draft", "d"], True),  # a DFlash2 draft directory: trees by default
        (["--backend", "exl3", "--draft", "d", "--chain"], False),
        (["--backend", "exl3", "--draft", "d", "--tree"], True),
        (["--backend", "exl3"], False),  # the default drafter there is n-gram: chains
        (["--backend", "exl3", "--draft", "ngram"], False),
        (["--backend", "exl3", "--draft", "none"], False),
        (["--draft", "ngram"], False),
        (["--draft", "ngram", "--tree"], True),
        ([], False),
    ],
)
def test_tree_mode_default(argv, tree):
    args = serve_args(*argv)
    assert cli.tree_mode(args) is tree
    assert cli.speculation_shape(args) == ((16, DEFAULT_DRAFT_TOP_K) if tree else (8, 1))
    assert cli.speculation_refusal(args) is None


def test_exl3_with_a_draft_loads_tree_mode_by_default():
    options = cli.exl3_load_options(serve_args("--backend", "exl3", "--draft", "d"))
    assert options["tree"] is True and options["tree_rows"] == 16
    chain = cli.exl3_load_options(serve_args("--backend", "exl3", "--draft", "d", "--chain"))
    assert chain["tree"] is False and "tree_rows" not in chain
    assert cli.speculation_shape(
        serve_args("--backend", "exl3", "--draft", "d", "--chain", "--tree-budget", "4")
    ) == (
        4,
        1,
    )


def test_tree_mode_refused_when_its_patch_is_off(monkeypatch):
    monkeypatch.setenv("ELPIS_PATCH_TREE_VERIFY", "0")
    refusal = cli.speculation_refusal(serve_args("--backend", "exl3", "--draft", "d"))
    assert refusal is not None and "ELPIS_PATCH_TREE_VERIFY=0" in refusal and "--chain" in refusal
    assert cli.speculation_refusal(serve_args("--backend", "exl3", "--draft", "d", "--chain")) is None
    monkeypatch.setenv("ELPIS_PATCH_TREE_VERIFY", "1")
    assert cli.speculation_refusal(serve_args("--backend", "exl3", "--draft", "d")) is None


def test_tree_and_chain_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--tree", "--chain")
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend", "exl3", "--draft", "d", "--tree"],
        ["--backend", "exl3", "--draft", "d", "--tree", "--tree-budget", "1"],
        ["--draft", "ngram", "--tree", "--tree-budget", "16"],
        ["--backend", "exl3"],
        [],
    ],
)
def test_accepted_combinations(argv):
    assert cli.speculation_refusal(serve_args(*argv)) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "exl3", "--tree"], "--tree on --backend exl3 needs a DFlash2 draft directory"),
        (["--backend", "exl3", "--draft", "none", "--tree"], "not --draft none"),
        (["--backend", "exl3", "--draft", "ngram", "--tree"], "not --draft ngram"),
        (["--tree"], "--tree needs a drafter"),
        (["--tree", "--tree-budget", "17"], "--tree-budget must be in 1..16, got 17"),
        (["--tree-budget", "0"], "--tree-budget must be in 1..16, got 0"),
        (["--draft", "some/dir"], "a draft model needs --backend exl3"),
    ],
)
def test_refusals_at_start_up(argv, message, capsys):
    """Refused before the listener opens or anything loads, with the reason and exit status 2."""
    assert main(["serve", "--no-auth", "--port", "0", *argv]) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refusing to start" in err and message in err


def test_exl3_load_options_carry_tree_mode(tmp_path: Path):
    options = cli.exl3_load_options(serve_args("--backend", "exl3", "--draft", "d", "--tree"))
    assert (
        options["tree"] is True and options["model_id"] == cli.REAL_MODEL_ID and "max_context" not in options
    )
    assert options["tree_rows"] == 16  # the default budget (16 rows) needs the 16-row shape
    small = cli.exl3_load_options(
        serve_args("--backend", "exl3", "--draft", "d", "--tree", "--tree-budget", "6")
    )
    assert small["tree_rows"] == 8
    options = cli.exl3_load_options(
        serve_args("--backend", "exl3", "--max-context", "4096", "--prefix-cache-dir", str(tmp_path))
    )
    assert options["tree"] is False and options["max_context"] == 4096 and "tree_rows" not in options
    assert options["disk_cache_dir"] == tmp_path
    # every option is a keyword of the loader
    import inspect

    from elpis.exl3 import load_backend

    assert set(options) <= set(inspect.signature(load_backend).parameters)


def test_prefill_chunk_option():
    assert cli.exl3_load_options(serve_args("--backend", "exl3"))["prefill_chunk"] == 2048
    options = cli.exl3_load_options(serve_args("--backend", "exl3", "--prefill-chunk", "8192"))
    assert options["prefill_chunk"] == 8192


def test_prefill_chunk_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--backend", "exl3", "--prefill-chunk", "1000")
    assert exit_info.value.code == 2
    assert "--prefill-chunk: invalid choice: 1000" in capsys.readouterr().err


def test_the_speculation_shape_is_logged_at_start(tiny_model: Path, caplog):
    common = ["--model", str(tiny_model), "--model-id", "tiny", "--no-auth", "--draft", "ngram"]
    with caplog.at_level("INFO", logger="elpis.server"):
        cli.build_service(serve_args(*common, "--tree"))
        cli.build_service(serve_args(*common))
    lines = [r.getMessage() for r in caplog.records if "speculation:" in r.getMessage()]
    assert lines == [
        f"[serve] speculation: ngram drafter, trees of up to 16 rows (top-{DEFAULT_DRAFT_TOP_K} per depth)",
        "[serve] speculation: ngram drafter, chains of 8 rows",
    ]


PROMPT = "one two three one two four one two five one two"  # "one two" was followed by 3 different words


def recording_service(args: argparse.Namespace, parents: list[list[int]]):
    """build_service as `elpis serve` runs it, with the parents of every verify call written down."""
    service = cli.build_service(args)
    backend = service.generator.backend
    verify = backend.verify

    def recorded(tokens, rows):
        parents.append(list(rows))
        return verify(tokens, rows)

    backend.verify = recorded
    return service


def complete(server, max_tokens: int = 20) -> str:
    reply = server.client().completions.create(
        model="tiny", prompt=PROMPT, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
    )
    return reply.choices[0].text


def test_tree_server_builds_trees_and_serves_plain_decoding(tiny_model: Path):
    """Reference backend: --tree builds trees from the n-gram drafter's candidates (verified exactly), chain
    mode builds chains, and both serve the text of plain decoding."""
    common = ["--model", str(tiny_model), "--model-id", "tiny", "--no-auth"]
    outputs, shapes = {}, {}
    for name, extra in (
        ("plain", ["--draft", "none"]),
        ("chain", ["--draft", "ngram"]),
        ("tree", ["--draft", "ngram", "--tree"]),
    ):
        args = serve_args(*common, *extra)
        assert cli.speculation_refusal(args) is None
        calls: list[list[int]] = []
        with running_server(lambda args=args, calls=calls: recording_service(args, calls)) as server:
            generator = server.server.service.generator
            shapes[name] = (generator.tree_budget, generator.draft_top_k)
            # 4 tokens: the first round drafts 3 deep, so the n-gram chain leaves room for its alternatives
            outputs[name] = (complete(server, 4), complete(server, 20))
        assert calls, name
        chains = [p == list(range(-1, len(p) - 1)) for p in calls]
        if name == "tree":
            assert not all(chains), "--tree never verified a branching tree"
            assert max(len(p) for p in calls) <= 16
        else:
            assert all(chains), f"{name}: a tree was verified without --tree"
            assert max(len(p) for p in calls) <= 8
    assert shapes == {"plain": (1, 1), "chain": (8, 1), "tree": (16, DEFAULT_DRAFT_TOP_K)}
    assert outputs["chain"] == outputs["plain"] and outputs["tree"] == outputs["plain"]


def test_prefill_group_option():
    assert "prefill_group" not in cli.exl3_load_options(serve_args("--backend", "exl3"))
    options = cli.exl3_load_options(serve_args("--backend", "exl3", "--prefill-group", "4"))
    assert options["prefill_group"] == 4
    assert cli.load_refusal(serve_args("--backend", "exl3", "--prefill-group", "4")) is None
    assert cli.load_refusal(serve_args("--backend", "exl3")) is None


def test_prefill_groups_the_loader_cannot_run_are_refused_at_start(capsys):
    refusal = cli.load_refusal(
        serve_args("--backend", "exl3", "--prefill-chunk", "8192", "--prefill-group", "4")
    )
    assert refusal is not None and "2048-token chunks" in refusal
    assert "exl3 backend option" in cli.load_refusal(serve_args("--prefill-group", "2"))
    assert cli.run(serve_args("--no-auth", "--prefill-group", "2")) == cli.EXIT_REFUSED
    assert "refusing to start: --prefill-group 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--backend", "exl3", "--prefill-group", "17")
    assert exit_info.value.code == 2
    assert "--prefill-group: invalid choice: 17" in capsys.readouterr().err
