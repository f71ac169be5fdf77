"""Every `crypten-lite` subcommand and option explains itself in `--help`."""

from __future__ import annotations

import argparse

import pytest

from crypten_lite import bench, certs, cli


def _walk(parser: argparse.ArgumentParser, path: str):
    """(path, action) for every option and positional of `parser` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", helps.get(name)
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}", action.help


def _parsers():
    return [("crypten-lite", cli.build_parser()), ("crypten-lite certs", certs._parser()),
            ("crypten-lite bench", bench.build_parser())]


def test_walk_sees_every_subcommand_and_option():
    seen = {path for prog, parser in _parsers() for path, _ in _walk(parser, prog)}
    for expected in ("crypten-lite launch", "crypten-lite party", "crypten-lite party script",
                     "crypten-lite dealer --listen", "crypten-lite health --timeout",
                     "crypten-lite health --target", "crypten-lite certs --parties/-n",
                     "crypten-lite bench --only", "crypten-lite bench --repeat"):
        assert expected in seen, f"{expected!r} not found among {sorted(seen)}"


@pytest.mark.parametrize("prog,parser", _parsers(), ids=lambda p: p if isinstance(p, str) else "")
def test_every_option_has_help(prog, parser):
    missing = [path for path, text in _walk(parser, prog) if not (text and text.strip())
               and text is not argparse.SUPPRESS]
    assert not missing, f"options without help text: {missing}"


def test_help_renders(capsys):
    for argv in (["party", "--help"], ["health", "--help"], ["launch", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.build_parser().parse_args(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "seconds to wait for the answer" in out and "arguments passed on to the script" in out
