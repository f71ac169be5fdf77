"""Every Python block of README.md and docs/*.md runs as written, or names the file that runs
its code: a comment `<!-- fragment: PATH ... -->` right above the block (an example, a test or
the library's own module). A fragment's example must be run by some test (checked here by
name); examples/transformers_from_config.py is run here, BERT and GPT-2 from tiny configs.

A runnable block is a party program: it runs on both parties of the shared 2-party pool, whose
session stands in for the one `crypten-lite launch` gives (its init() / uninit() are no-ops
there). Nothing is downloaded: a block that needs the network is a fragment.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import runpy
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = re.compile(r"<!-- fragment: (\S+)")
EXAMPLE = ROOT / "examples" / "transformers_from_config.py"
RUN_HERE = {"transformers_from_config.py", "train_mlp.py"}  # the examples these tests run


def python_blocks() -> list[tuple[str, int, str, str | None]]:
    """(doc, line, source, fragment path or None) of every ```python block."""
    blocks = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```python"):
                j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
                above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
                found = FRAGMENT.match(above)
                blocks.append((doc.relative_to(ROOT).as_posix(), i + 1, "\n".join(lines[i + 1:j]),
                               found.group(1) if found else None))
                i = j
            i += 1
    return blocks


BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if b[3] is None]
FRAGMENTS = [b for b in BLOCKS if b[3] is not None]


@contextlib.contextmanager
def _launch_session(argv: list[str] | None = None):
    """The pool's session in place of a launch's: init() / uninit() do nothing, stdout kept."""
    import crypten_lite

    saved = crypten_lite.init, crypten_lite.uninit, sys.argv
    crypten_lite.init = lambda *args, **kwargs: None
    crypten_lite.uninit = lambda: None
    if argv is not None:
        sys.argv = argv
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        crypten_lite.init, crypten_lite.uninit, sys.argv = saved


def party_block(source: str, where: str) -> str:
    with _launch_session() as out:
        exec(compile(source, where, "exec"), {"__name__": "__main__"})  # noqa: S102 (the doc's code)
    return out.getvalue()


def party_example(path: str, args: list[str]) -> str:
    with _launch_session([path, *args]) as out:
        runpy.run_path(path, run_name="__main__")
    return out.getvalue()


def test_every_block_is_found():
    assert len(BLOCKS) >= 15 and RUNNABLE, [b[:2] for b in BLOCKS]


@pytest.mark.parametrize("doc,line,source,fragment", RUNNABLE, ids=[f"{b[0]}:{b[1]}" for b in RUNNABLE])
def test_block_runs_as_written(pool2, doc, line, source, fragment):
    outputs = pool2.run(party_block, source, f"{doc}:{line}")
    assert all(out.strip() for out in outputs), outputs  # each block prints its result


@pytest.mark.parametrize("doc,line,source,fragment", FRAGMENTS, ids=[f"{b[0]}:{b[1]}" for b in FRAGMENTS])
def test_fragment_names_what_runs_it(doc, line, source, fragment):
    path = ROOT / fragment
    assert path.is_file(), f"{doc}:{line}: the fragment names {fragment}, which does not exist"
    if fragment.startswith("examples/") and path.name not in RUN_HERE:
        tests = [p for p in (ROOT / "tests").rglob("test_*.py")
                 if p.name != pathlib.Path(__file__).name and path.name in p.read_text()]
        assert tests, f"{doc}:{line}: no test runs {fragment}"


@pytest.mark.parametrize("args,expect", [
    ([], "same class: True"),
    (["--model", "gpt2"], "equal to torch's greedy tokens: True"),
], ids=["bert", "gpt2"])
def test_transformers_from_config_example(pool2, args, expect):
    """The example the transformers guides point to, offline, against torch's own answer."""
    pytest.importorskip("transformers")
    outputs = pool2.run(party_example, str(EXAMPLE), args)
    assert expect in outputs[0], outputs
    if args:  # generation: only party 1 receives the tokens
        assert "private generation:" in outputs[1] and "private generation:" not in outputs[0]
    else:
        logits = [re.search(r"private logits: (\[.*\])", out).group(1) for out in outputs]
        assert logits[0] == logits[1], outputs


def test_train_mlp_example(pool2):
    """docs/training.md's example, one epoch of a small MLP: private accuracy near torch's."""
    outputs = pool2.run(party_example, str(ROOT / "examples" / "train_mlp.py"),
                        ["--epochs", "1", "--hidden", "16"])
    found = re.search(r"private test accuracy ([\d.]+)%, plaintext torch ([\d.]+)%", outputs[0])
    assert found, outputs
    private, plain = float(found.group(1)), float(found.group(2))
    assert plain > 50 and abs(private - plain) <= 10, outputs[0]
